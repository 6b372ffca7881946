"""Pure-torch linear-recurrence scans: the oracle and the CPU path.

Two families, both for the diagonal recurrence ``y_t = a_t * y_{t-1} + b_t`` and the block-diagonal
recurrence ``y_t = A_t @ y_{t-1} + b_t`` (one ``k x k`` block per channel):

* ``sequential_*`` -- a plain loop over time, in the inputs' dtype. Slow and obviously right: tests
  run it in float64 as the reference every other path is compared with.
* ``reference_*`` -- log-depth (Hillis-Steele doubling) scans on whole tensors, accumulating in
  float32 (float64 inputs stay float64). This is the ``"eager"`` backend.

``reverse=True`` runs the recurrence from the last step to the first: ``y_t = a_t * y_{t+1} + b_t``
with ``y_T = h0``. The ``*_backward`` functions implement the adjoint (a scan in the other direction,
see ``docs/kernels.md``) and are what the eager backend registers as its autograd formula.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..dispatch import compute_dtype

__all__ = [
    "reference_scan_block_diag",
    "reference_scan_block_diag_backward",
    "reference_scan_diag",
    "reference_scan_diag_backward",
    "sequential_scan_block_diag",
    "sequential_scan_diag",
]


# --------------------------------------------------------------------------------------------
# Sequential loops (the oracle)
# --------------------------------------------------------------------------------------------


def sequential_scan_diag(
    jac: Tensor, rhs: Tensor, h0: Tensor | None = None, *, reverse: bool = False
) -> Tensor:
    """Step-by-step diagonal scan in the inputs' dtype. jac, rhs ``[B, T, D]``, h0 ``[B, D]``."""
    batch, steps, channels = rhs.shape
    state = rhs.new_zeros(batch, channels) if h0 is None else h0
    out = torch.empty_like(rhs)
    order = range(steps - 1, -1, -1) if reverse else range(steps)
    for t in order:
        state = jac[:, t] * state + rhs[:, t]
        out[:, t] = state
    return out


def sequential_scan_block_diag(
    jac: Tensor, rhs: Tensor, h0: Tensor | None = None, *, reverse: bool = False
) -> Tensor:
    """Step-by-step block scan. jac ``[B, T, D, k, k]``, rhs ``[B, T, D, k]``, h0 ``[B, D, k]``."""
    batch, steps, channels, k = rhs.shape
    state = rhs.new_zeros(batch, channels, k) if h0 is None else h0
    out = torch.empty_like(rhs)
    order = range(steps - 1, -1, -1) if reverse else range(steps)
    for t in order:
        state = torch.einsum("bdij,bdj->bdi", jac[:, t], state) + rhs[:, t]
        out[:, t] = state
    return out


# --------------------------------------------------------------------------------------------
# Log-depth scans (the "eager" backend)
# --------------------------------------------------------------------------------------------


def _doubling_scan_diag(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """Inclusive prefix of (a, b) pairs along dim 1 under (a2, b2)∘(a1, b1) = (a2 a1, a2 b1 + b2)."""
    steps = a.shape[1]
    offset = 1
    while offset < steps:
        a_prev, b_prev = a[:, :-offset], b[:, :-offset]
        a_cur, b_cur = a[:, offset:], b[:, offset:]
        b = torch.cat([b[:, :offset], a_cur * b_prev + b_cur], dim=1)
        a = torch.cat([a[:, :offset], a_cur * a_prev], dim=1)
        offset *= 2
    return a, b


def _doubling_scan_block(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """Block version of :func:`_doubling_scan_diag`: a ``[B, T, D, k, k]``, b ``[B, T, D, k]``."""
    steps = a.shape[1]
    offset = 1
    while offset < steps:
        a_prev, b_prev = a[:, :-offset], b[:, :-offset]
        a_cur, b_cur = a[:, offset:], b[:, offset:]
        b = torch.cat([b[:, :offset], (a_cur @ b_prev.unsqueeze(-1)).squeeze(-1) + b_cur], dim=1)
        a = torch.cat([a[:, :offset], a_cur @ a_prev], dim=1)
        offset *= 2
    return a, b


def reference_scan_diag(
    jac: Tensor, rhs: Tensor, h0: Tensor | None = None, *, reverse: bool = False
) -> Tensor:
    """Log-depth diagonal scan, accumulating in :func:`compute_dtype`; returns the inputs' dtype.

    jac, rhs ``[B, T, D]``; h0 ``[B, D]`` or None (zeros). Output ``[B, T, D]``.
    """
    acc = compute_dtype(rhs.dtype)
    # copy=True: the result must never alias an input (custom ops forbid it).
    a, b = jac.to(acc), rhs.to(acc, copy=True)
    if reverse:
        a, b = a.flip(1), b.flip(1)
    prod, y = _doubling_scan_diag(a, b)
    if h0 is not None:
        y = y + prod * h0.to(acc).unsqueeze(1)
    if reverse:
        y = y.flip(1)
    return y.to(rhs.dtype)


def reference_scan_block_diag(
    jac: Tensor, rhs: Tensor, h0: Tensor | None = None, *, reverse: bool = False
) -> Tensor:
    """Log-depth block scan; jac ``[B, T, D, k, k]``, rhs ``[B, T, D, k]``, h0 ``[B, D, k]``."""
    acc = compute_dtype(rhs.dtype)
    a, b = jac.to(acc), rhs.to(acc, copy=True)
    if reverse:
        a, b = a.flip(1), b.flip(1)
    prod, y = _doubling_scan_block(a, b)
    if h0 is not None:
        y = y + (prod @ h0.to(acc)[:, None, :, :, None]).squeeze(-1)
    if reverse:
        y = y.flip(1)
    return y.to(rhs.dtype)


# --------------------------------------------------------------------------------------------
# Adjoints
# --------------------------------------------------------------------------------------------


def _shift_towards_start(x: Tensor, reverse: bool) -> Tensor:
    """``x`` moved one step along the recurrence direction's opposite, zero-padded.

    Forward recurrences need ``a_{t+1}`` in their adjoint, reverse ones ``a_{t-1}``.
    """
    pad = torch.zeros_like(x[:, :1])
    if reverse:
        return torch.cat([pad, x[:, :-1]], dim=1)
    return torch.cat([x[:, 1:], pad], dim=1)


def _previous_state(y: Tensor, h0: Tensor | None, reverse: bool) -> Tensor:
    """The state each step consumed: ``y_{t-1}`` (``y_{t+1}`` when reverse), h0 at the boundary."""
    first = torch.zeros_like(y[:, :1]) if h0 is None else h0.unsqueeze(1).to(y.dtype)
    if reverse:
        return torch.cat([y[:, 1:], first], dim=1)
    return torch.cat([first, y[:, :-1]], dim=1)


def reference_scan_diag_backward(
    jac: Tensor, y: Tensor, h0: Tensor | None, grad_y: Tensor, *, reverse: bool = False
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of :func:`reference_scan_diag` with respect to (jac, rhs, h0).

    With ``g = ∂L/∂y`` the adjoint is the scan in the other direction
    ``μ_t = g_t + a_{t+1} μ_{t+1}`` (``a_{t-1} μ_{t-1}`` for reverse); then ``∂L/∂rhs = μ``,
    ``∂L/∂jac_t = μ_t * y_{t-1}`` and ``∂L/∂h0 = a_first * μ_first``. All ``[B, T, D]`` except the
    last, ``[B, D]`` (returned even when h0 is None, as zeros-input gradient).
    """
    acc = compute_dtype(y.dtype)
    a = jac.to(acc)
    mu = reference_scan_diag(_shift_towards_start(a, reverse), grad_y.to(acc), reverse=not reverse)
    grad_jac = mu * _previous_state(y.to(acc), h0, reverse)
    first = -1 if reverse else 0
    grad_h0 = a[:, first] * mu[:, first]
    return grad_jac.to(jac.dtype), mu.to(y.dtype), grad_h0.to(y.dtype)


def reference_scan_block_diag_backward(
    jac: Tensor, y: Tensor, h0: Tensor | None, grad_y: Tensor, *, reverse: bool = False
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of :func:`reference_scan_block_diag` with respect to (jac, rhs, h0).

    ``μ_t = g_t + A_{t+1}ᵀ μ_{t+1}``; ``∂L/∂rhs = μ``, ``∂L/∂A_t = μ_t y_{t-1}ᵀ``,
    ``∂L/∂h0 = A_firstᵀ μ_first``.
    """
    acc = compute_dtype(y.dtype)
    a_t = jac.to(acc).transpose(-1, -2)
    mu = reference_scan_block_diag(
        _shift_towards_start(a_t, reverse), grad_y.to(acc), reverse=not reverse
    )
    grad_jac = mu.unsqueeze(-1) * _previous_state(y.to(acc), h0, reverse).unsqueeze(-2)
    first = -1 if reverse else 0
    grad_h0 = (a_t[:, first] @ mu[:, first].unsqueeze(-1)).squeeze(-1)
    return grad_jac.to(jac.dtype), mu.to(y.dtype), grad_h0.to(y.dtype)
