"""The fused layer path: whole-layer kernels of :mod:`pararnn_kernels.fused` for built-in cells.

``NewtonConfig(scan_backend="fused")`` runs a layer's Newton solve as one fused kernel (chunks of
time solved on-chip from the exact state, DESIGN §4) and its eq. 2.6 backward as one fused reverse
pass; ``"auto"`` does the same on CUDA when the cell has fused kernels, or runs the fused
*sequential* kernel where the cost model says one step at a time is faster. The choice is in
:attr:`NewtonStats.backend`: ``"fused"`` or ``"fused_sequential"`` (then ``iters = 0`` and the
residual is recorded as 0: the states are the recurrence itself; non-finite states raise
:class:`~pararnn_core.NewtonDivergenceError`).

Cells with fused kernels: :class:`~pararnn_core.ParaGRU`. Other cells keep the unfused path
(``"auto"``) or raise a clear error (``"fused"``).
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from pararnn_kernels.fused import (
    check_fused_supported,
    choose_fused_gru_method,
    fused_gru_backward,
    fused_gru_newton,
    fused_gru_sequential,
)

from ._validation import check_cell, check_sequence, check_state, float_eps
from .cells.base import ParaCell
from .cells.gru import ParaGRU
from .config import NewtonConfig, NewtonDivergenceError, NewtonStats

__all__ = [
    "FusedMethod",
    "fused_kernels_apply",
    "fused_method",
    "fused_newton_apply",
    "fused_sequential_apply",
    "has_fused_kernels",
]

FusedMethod = Literal["fused", "fused_sequential"]


def has_fused_kernels(cell: ParaCell) -> bool:
    """Whether ``cell`` has fused layer kernels (exactly the built-in :class:`ParaGRU`)."""
    return type(cell) is ParaGRU


def fused_kernels_apply(cell: ParaCell, u: Tensor) -> bool:
    """Whether the fused kernels serve ``cell`` on CUDA tensors like ``u`` (device and dtype)."""
    if not has_fused_kernels(cell):
        return False
    try:
        check_fused_supported(u)
    except ValueError:
        return False
    return u.device.type == "cuda"


def fused_method(cell: ParaCell, u: Tensor, config: NewtonConfig) -> FusedMethod | None:
    """Which fused path ``config.scan_backend`` selects for ``cell`` on ``u [B, T, d_u]``.

    ``"fused"`` always gives the fused Newton kernel (or raises); ``"auto"`` gives the cost
    model's pick on CUDA for cells with fused kernels and None otherwise (the unfused path);
    every other name gives None.

    Raises:
        ValueError: ``"fused"`` for a cell without fused kernels, or a device or dtype the
            kernels cannot serve (the message says which).
    """
    if config.scan_backend == "fused":
        if not has_fused_kernels(cell):
            raise ValueError(
                "scan_backend='fused' has kernels for ParaGRU only; got a "
                f"{type(cell).__name__}: use scan_backend='auto' (the unfused Newton path)"
            )
        check_fused_supported(u)
        return "fused"
    if config.scan_backend == "auto" and fused_kernels_apply(cell, u):
        batch, steps, width = u.shape
        choice = choose_fused_gru_method(batch, steps, width // 3, u.device, u.dtype)
        return "fused" if choice == "newton" else "fused_sequential"
    return None


def _weight(cell: ParaCell) -> Tensor:
    weight: Tensor = cell.get_parameter("recurrent_weight")
    return weight


class _FusedLayerFunction(torch.autograd.Function):
    """``states = layer(u, h0; weight)`` by a fused kernel, backward by the fused eq. 2.6 pass.

    The recurrent weight is an explicit input (DDP/FSDP hooks see it as for a Linear); the input
    projection's parameters get their gradients through ``u`` by ordinary autograd.
    """

    @staticmethod
    def forward(
        ctx: Any,
        cell: ParaCell,
        config: NewtonConfig,
        method: FusedMethod,
        stats_out: list[NewtonStats],
        u: Tensor,
        h0: Tensor,
        weight: Tensor,
    ) -> Tensor:
        if method == "fused_sequential":
            states = fused_gru_sequential(u, weight, h0)
            # A non-finite value carries forward in time, so the last state shows any of them
            # (one small read and one host sync, as the Newton path's residual check).
            if not bool(torch.isfinite(states[:, -1]).all()):
                raise NewtonDivergenceError(
                    (math.inf,),
                    config.divergence_threshold,
                    f" in a {type(cell).__name__} layer (B={u.shape[0]}, T={u.shape[1]}): the "
                    "fused sequential recurrence (picked by scan_backend='auto') produced "
                    "non-finite states",
                )
            stats = NewtonStats(0, 0.0, (0.0,), "fused_sequential", True)
        else:
            states, stats = _solve(cell, config, u, h0, weight)
        stats_out.append(stats)
        ctx.save_for_backward(u, h0, states, weight)
        return states

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_states: Tensor) -> tuple[Tensor | None, ...]:
        u, h0, states, weight = ctx.saved_tensors
        grad_u, grad_h0, grad_weight = fused_gru_backward(u, weight, h0, states, grad_states)
        needs = ctx.needs_input_grad
        return (
            None,
            None,
            None,
            None,
            grad_u if needs[4] else None,
            grad_h0 if needs[5] else None,
            grad_weight if needs[6] else None,
        )


def _solve(
    cell: ParaCell, config: NewtonConfig, u: Tensor, h0: Tensor, weight: Tensor
) -> tuple[Tensor, NewtonStats]:
    result = fused_gru_newton(
        u,
        weight,
        h0,
        max_iters=config.max_iters,
        tol=config.tol,
        omega=config.omega,
        initial_guess=config.initial_guess,
    )
    history = result.residuals
    threshold = config.divergence_threshold
    worst = result.max_residual
    diverged = any(not math.isfinite(v) or v > threshold for v in (*history, worst))
    if not diverged:
        tol = config.tol if config.tol is not None else math.sqrt(float_eps(u.dtype))
        return result.states, NewtonStats(result.iters, worst, history, "fused", worst <= tol)
    where = (
        f" in a {type(cell).__name__} layer (B={u.shape[0]}, T={u.shape[1]}, scan backend "
        f"'fused', {result.passes} pass(es))"
    )
    if config.on_divergence == "raise":
        raise NewtonDivergenceError(history, threshold, where)
    states = fused_gru_sequential(u, weight, h0)
    if not bool(torch.isfinite(states).all()):
        raise NewtonDivergenceError(
            history, threshold, where + "; the sequential recomputation is not finite either"
        )
    return states, NewtonStats(result.iters, 0.0, history, "fused", False, fallback="sequential")


def fused_newton_apply(
    cell: ParaCell, u: Tensor, h0: Tensor, config: NewtonConfig, method: FusedMethod
) -> tuple[Tensor, NewtonStats]:
    """Run a layer on projected inputs ``u [B, T, d_u]`` from ``h0 [B, d_h]`` by ``method``.

    Called by :func:`~pararnn_core.newton_apply` when :func:`fused_method` picks a fused path;
    differentiable in ``u``, ``h0`` and the recurrent weight.
    """
    stats_out: list[NewtonStats] = []
    states: Tensor = _FusedLayerFunction.apply(
        cell, config, method, stats_out, u, h0, _weight(cell)
    )
    return states, stats_out[0]


def fused_sequential_apply(cell: ParaCell, x: Tensor, h0: Tensor | None = None) -> Tensor:
    """Run a cell over a sequence one step at a time in one fused kernel.

    The fast ``.eval()`` path of :class:`~pararnn_core.ParaRNN` and the honest sequential
    baseline; differentiable (its backward is the fused eq. 2.6 pass, which equals BPTT).

    Args:
        cell: a cell with fused kernels (:func:`has_fused_kernels`).
        x: ``[B, T, d_in]`` inputs on CUDA (or CPU under ``TRITON_INTERPRET=1``).
        h0: ``[B, d_h]`` initial state, or None for zeros.

    Returns:
        ``states [B, T, d_h]``, as :func:`~pararnn_core.sequential_apply` returns them.

    Raises:
        ValueError: the cell has no fused kernels, or the device/dtype cannot run them.
    """
    cell = check_cell(cell)
    if not has_fused_kernels(cell):
        raise ValueError(
            f"fused_sequential_apply has kernels for ParaGRU only; got a {type(cell).__name__}: "
            "use sequential_apply"
        )
    x = check_sequence(cell, x)
    h0_t = check_state(cell, h0, x.shape[0], x)
    u = cell.project(x)
    check_fused_supported(u)
    config = NewtonConfig(scan_backend="fused")
    states, _stats = fused_newton_apply(cell, u, h0_t, config, "fused_sequential")
    return states
