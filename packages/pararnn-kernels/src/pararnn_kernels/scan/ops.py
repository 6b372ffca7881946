"""The public scan ops: validation, ``torch.library`` registration, autograd, and dispatch.

Each backend's forward and adjoint is a ``torch.library`` op (``triton_op`` for the Triton
kernels, ``custom_op`` for the eager reference) with its autograd formula registered, so the
public functions trace under ``torch.compile(fullgraph=True)`` and pass ``torch.library.opcheck``.
In plain eager mode (no ``torch.compile``, no dispatch mode) the Triton scans run through a plain
``torch.autograd.Function`` over the same launchers (the dispatcher's round trips cost more host
time than small scans take).
The adjoint is itself a scan in the other direction (``docs/kernels.md``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .._launch import plain_eager
from ..dispatch import STORAGE_DTYPES, resolve_scan_backend
from . import launch
from .reference import (
    reference_scan_block_diag,
    reference_scan_block_diag_backward,
    reference_scan_diag,
    reference_scan_diag_backward,
)

__all__ = ["MAX_TRITON_BLOCK", "scan_block_diag", "scan_diag"]

#: Largest block size ``k`` the Triton block-diagonal kernel serves (larger k runs eager).
MAX_TRITON_BLOCK = 4

_NS = "pararnn_kernels"


# ----------------------------------------------------------------------------------------------
# Ops: eager reference
# ----------------------------------------------------------------------------------------------


@torch.library.custom_op(f"{_NS}::scan_diag_eager", mutates_args=())
def _scan_diag_eager(jac: Tensor, rhs: Tensor, h0: Tensor | None, reverse: bool) -> Tensor:
    return reference_scan_diag(jac, rhs, h0, reverse=reverse)


@torch.library.custom_op(f"{_NS}::scan_diag_eager_backward", mutates_args=())
def _scan_diag_eager_backward(
    jac: Tensor, y: Tensor, h0: Tensor | None, grad_y: Tensor, reverse: bool
) -> tuple[Tensor, Tensor, Tensor]:
    return reference_scan_diag_backward(jac, y, h0, grad_y, reverse=reverse)


@torch.library.custom_op(f"{_NS}::scan_block_diag_eager", mutates_args=())
def _scan_block_diag_eager(jac: Tensor, rhs: Tensor, h0: Tensor | None, reverse: bool) -> Tensor:
    return reference_scan_block_diag(jac, rhs, h0, reverse=reverse)


@torch.library.custom_op(f"{_NS}::scan_block_diag_eager_backward", mutates_args=())
def _scan_block_diag_eager_backward(
    jac: Tensor, y: Tensor, h0: Tensor | None, grad_y: Tensor, reverse: bool
) -> tuple[Tensor, Tensor, Tensor]:
    return reference_scan_block_diag_backward(jac, y, h0, grad_y, reverse=reverse)


@_scan_diag_eager.register_fake
@_scan_block_diag_eager.register_fake
def _scan_fake(jac: Tensor, rhs: Tensor, h0: Tensor | None, reverse: bool) -> Tensor:
    return torch.empty_like(rhs)


@_scan_diag_eager_backward.register_fake
@_scan_block_diag_eager_backward.register_fake
def _scan_backward_fake(
    jac: Tensor, y: Tensor, h0: Tensor | None, grad_y: Tensor, reverse: bool
) -> tuple[Tensor, Tensor, Tensor]:
    state_shape = (y.shape[0], *y.shape[2:])
    return torch.empty_like(jac), torch.empty_like(y), y.new_empty(state_shape)


# ----------------------------------------------------------------------------------------------
# Ops: Triton
# ----------------------------------------------------------------------------------------------


@torch.library.triton_op(f"{_NS}::scan_diag_triton", mutates_args=())
def _scan_diag_triton(jac: Tensor, rhs: Tensor, h0: Tensor | None, reverse: bool) -> Tensor:
    return launch.triton_scan_diag(jac, rhs, h0, reverse=reverse)


@torch.library.triton_op(f"{_NS}::scan_diag_triton_backward", mutates_args=())
def _scan_diag_triton_backward(
    jac: Tensor, y: Tensor, h0: Tensor | None, grad_y: Tensor, reverse: bool
) -> tuple[Tensor, Tensor, Tensor]:
    return launch.triton_scan_diag_backward(jac, y, h0, grad_y, reverse=reverse)


@torch.library.triton_op(f"{_NS}::scan_block_diag_triton", mutates_args=())
def _scan_block_diag_triton(jac: Tensor, rhs: Tensor, h0: Tensor | None, reverse: bool) -> Tensor:
    return launch.triton_scan_block_diag(jac, rhs, h0, reverse=reverse)


@torch.library.triton_op(f"{_NS}::scan_block_diag_triton_backward", mutates_args=())
def _scan_block_diag_triton_backward(
    jac: Tensor, y: Tensor, h0: Tensor | None, grad_y: Tensor, reverse: bool
) -> tuple[Tensor, Tensor, Tensor]:
    return launch.triton_scan_block_diag_backward(jac, y, h0, grad_y, reverse=reverse)


# ----------------------------------------------------------------------------------------------
# Autograd: every forward op's gradient is its backward op (one scan the other way).
# ----------------------------------------------------------------------------------------------


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    jac, _rhs, h0, reverse = inputs
    ctx.save_for_backward(jac, h0, output)
    ctx.reverse = reverse
    ctx.has_h0 = h0 is not None


def _adjoint(
    ctx: Any, grad_y: Tensor, backward_op: Any, adjoint_op: Any = None
) -> tuple[Tensor, Tensor, Tensor | None]:
    """``(∂L/∂jac, ∂L/∂rhs, ∂L/∂h0 or None)`` by ``backward_op``, or by ``adjoint_op`` (the
    backward without ``∂L/∂h0``, when given) while h0 needs no gradient."""
    jac, h0, y = ctx.saved_tensors
    # Upstream gradients may be expanded (stride 0) or otherwise strided.
    grad_y = grad_y.contiguous()
    if adjoint_op is not None and not ctx.needs_input_grad[2]:
        grad_jac, grad_rhs = adjoint_op(jac, y, h0, grad_y, reverse=ctx.reverse)
        return grad_jac, grad_rhs, None
    grad_jac, grad_rhs, grad_h0 = backward_op(jac, y, h0, grad_y, reverse=ctx.reverse)
    return grad_jac, grad_rhs, (grad_h0 if ctx.has_h0 else None)


def _make_backward(backward_op: Any) -> Any:
    def backward(ctx: Any, grad_y: Tensor) -> tuple[Tensor | None, ...]:
        return (*_adjoint(ctx, grad_y, backward_op), None)

    return backward


for _forward, _backward in (
    (_scan_diag_eager, _scan_diag_eager_backward),
    (_scan_block_diag_eager, _scan_block_diag_eager_backward),
    (_scan_diag_triton, _scan_diag_triton_backward),
    (_scan_block_diag_triton, _scan_block_diag_triton_backward),
):
    torch.library.register_autograd(
        _forward, _make_backward(_backward), setup_context=_setup_context
    )


class _EagerTritonScan(torch.autograd.Function):
    """The Triton scans in plain eager mode: the same launchers and the same adjoint as the
    registered ops, without the dispatcher's round trips (the op's autograd wrapper, its
    redispatch and the higher-order op cost about 0.3-0.4 ms of host time per forward and
    backward on the H200's host, more than the kernels themselves up to B·T·D = 2^25). Like the
    registered ops, differentiable once. ``adjoint_fn`` (or None) is the backward launcher
    without ``∂L/∂h0``, used when h0 needs no gradient."""

    @staticmethod
    def forward(
        ctx: Any,
        jac: Tensor,
        rhs: Tensor,
        h0: Tensor | None,
        reverse: bool,
        forward_fn: Any,
        backward_fn: Any,
        adjoint_fn: Any,
    ) -> Tensor:
        y: Tensor = forward_fn(jac, rhs, h0, reverse=reverse)
        _setup_context(ctx, (jac, rhs, h0, reverse), y)
        ctx.backward_fn = backward_fn
        ctx.adjoint_fn = adjoint_fn
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_y: Tensor) -> tuple[Tensor | None, ...]:
        # The registered ops' adjoint; no gradient for reverse and the three launchers.
        grads = _adjoint(ctx, grad_y, ctx.backward_fn, ctx.adjoint_fn)
        return (*grads, None, None, None, None)


def _triton_scan(
    op: Any, forward_fn: Any, backward_fn: Any, adjoint_fn: Any, jac: Tensor, rhs: Tensor,
    h0: Tensor | None, reverse: bool,
) -> Tensor:  # fmt: skip
    """The registered op while ``torch.compile`` or any dispatch mode traces; in plain eager
    mode the lean autograd function, or the launcher alone when no input needs a gradient."""
    if not plain_eager():
        traced: Tensor = op(jac, rhs, h0, reverse)
        return traced
    if not torch.is_grad_enabled() or not (
        jac.requires_grad or rhs.requires_grad or (h0 is not None and h0.requires_grad)
    ):
        untracked: Tensor = forward_fn(jac, rhs, h0, reverse=reverse)
        return untracked
    result: Tensor = _EagerTritonScan.apply(
        jac, rhs, h0, reverse, forward_fn, backward_fn, adjoint_fn
    )
    return result


# ----------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------


def _check_tensor(name: str, value: object) -> Tensor:
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.dtype not in STORAGE_DTYPES:
        allowed = ", ".join(str(d) for d in STORAGE_DTYPES)
        raise TypeError(f"{name} must have a floating dtype ({allowed}), got {value.dtype}")
    return value


def _check_like(name: str, value: Tensor, rhs: Tensor, shape: tuple[int, ...], layout: str) -> None:
    if tuple(value.shape) != shape:
        raise ValueError(f"{name} must have shape {layout} = {shape}, got {tuple(value.shape)}")
    if value.dtype != rhs.dtype:
        raise TypeError(f"{name} must have rhs's dtype {rhs.dtype}, got {value.dtype}")
    if value.device != rhs.device:
        raise ValueError(f"{name} must be on rhs's device {rhs.device}, got {value.device}")


def _check_scan_inputs(
    jac: object, rhs: object, h0: object, *, block: bool
) -> tuple[Tensor, Tensor, Tensor | None]:
    rhs_t = _check_tensor("rhs", rhs)
    jac_t = _check_tensor("jac", jac)
    rank, layout = (4, "[B, T, D, k]") if block else (3, "[B, T, D]")
    if rhs_t.dim() != rank:
        raise ValueError(
            f"rhs must have {rank} dimensions {layout}, got {rhs_t.dim()} (shape {tuple(rhs_t.shape)})"
        )
    if any(size == 0 for size in rhs_t.shape):
        raise ValueError(
            f"rhs must be non-empty in every dimension {layout}, got {tuple(rhs_t.shape)}"
        )
    if block:
        k = rhs_t.shape[-1]
        _check_like("jac", jac_t, rhs_t, (*rhs_t.shape, k), "[B, T, D, k, k]")
    else:
        _check_like("jac", jac_t, rhs_t, tuple(rhs_t.shape), "[B, T, D]")
    h0_t: Tensor | None = None
    if h0 is not None:
        h0_t = _check_tensor("h0", h0)
        state = (rhs_t.shape[0], *rhs_t.shape[2:])
        _check_like("h0", h0_t, rhs_t, state, "[B, D, k]" if block else "[B, D]")
    return jac_t, rhs_t, h0_t


def _contiguous(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.contiguous()


# ----------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------


def scan_diag(
    jac: Tensor,
    rhs: Tensor,
    h0: Tensor | None = None,
    *,
    reverse: bool = False,
    backend: str = "auto",
) -> Tensor:
    """Diagonal linear recurrence, solved in parallel over time.

    Forward: ``y_t = jac_t ⊙ y_{t-1} + rhs_t`` with ``y_{-1} = h0``, so
    ``y[:, 0] = jac[:, 0] * h0 + rhs[:, 0]``. ``reverse=True``: ``y_t = jac_t ⊙ y_{t+1} + rhs_t``
    with ``y_T = h0``, so ``y[:, -1] = jac[:, -1] * h0 + rhs[:, -1]``.

    Args:
        jac: ``[B, T, D]`` per-step multipliers.
        rhs: ``[B, T, D]`` per-step offsets.
        h0: ``[B, D]`` initial state, or None for zeros.
        reverse: run from the last step to the first.
        backend: ``"auto"`` (Triton on CUDA, eager elsewhere), ``"triton"`` or ``"eager"``.

    Returns:
        ``[B, T, D]`` states, in rhs's dtype (accumulated in float32, float64 for float64).
        Differentiable in jac, rhs and h0; the backward is one scan in the other direction.

    Example:
        >>> import torch
        >>> from pararnn_kernels import scan_diag
        >>> jac, rhs = torch.full((1, 3, 2), 0.5), torch.ones(1, 3, 2)
        >>> scan_diag(jac, rhs)[0, :, 0]
        tensor([1.0000, 1.5000, 1.7500])
    """
    jac_t, rhs_t, h0_t = _check_scan_inputs(jac, rhs, h0, block=False)
    resolved = resolve_scan_backend(backend, rhs_t.device, rhs_t.dtype)
    args = (jac_t.contiguous(), rhs_t.contiguous(), _contiguous(h0_t), reverse)
    if resolved == "triton":
        return _triton_scan(
            _scan_diag_triton,
            launch.triton_scan_diag,
            launch.triton_scan_diag_backward,
            launch.triton_scan_diag_adjoint,
            *args,
        )
    result: Tensor = _scan_diag_eager(*args)
    return result


def scan_block_diag(
    jac: Tensor,
    rhs: Tensor,
    h0: Tensor | None = None,
    *,
    reverse: bool = False,
    backend: str = "auto",
) -> Tensor:
    """Block-diagonal linear recurrence (one ``k x k`` block per channel), parallel over time.

    ``y_t = jac_t @ y_{t-1} + rhs_t`` per channel with ``y_{-1} = h0``; ``reverse=True`` runs
    ``y_t = jac_t @ y_{t+1} + rhs_t`` with ``y_T = h0``.

    Args:
        jac: ``[B, T, D, k, k]`` per-step blocks.
        rhs: ``[B, T, D, k]`` per-step offsets.
        h0: ``[B, D, k]`` initial state, or None for zeros.
        reverse: run from the last step to the first.
        backend: ``"auto"``, ``"triton"`` (k <= 4) or ``"eager"`` (any k).

    Returns:
        ``[B, T, D, k]`` states in rhs's dtype; differentiable in jac, rhs and h0.

    Example:
        >>> import torch
        >>> from pararnn_kernels import scan_block_diag
        >>> jac = torch.eye(2).expand(1, 3, 1, 2, 2)
        >>> scan_block_diag(jac, torch.ones(1, 3, 1, 2))[0, :, 0, 0]
        tensor([1., 2., 3.])
    """
    jac_t, rhs_t, h0_t = _check_scan_inputs(jac, rhs, h0, block=True)
    k = rhs_t.shape[-1]
    resolved = resolve_scan_backend(backend, rhs_t.device, rhs_t.dtype)
    if resolved == "triton" and k > MAX_TRITON_BLOCK:
        if backend == "triton":
            raise ValueError(
                f"backend='triton' serves blocks up to k={MAX_TRITON_BLOCK}, got k={k}; "
                "use backend='eager' or 'auto'"
            )
        resolved = "eager"
    args = (jac_t.contiguous(), rhs_t.contiguous(), _contiguous(h0_t), reverse)
    if resolved == "triton":
        return _triton_scan(
            _scan_block_diag_triton,
            launch.triton_scan_block_diag,
            launch.triton_scan_block_diag_backward,
            None,
            *args,
        )
    result: Tensor = _scan_block_diag_eager(*args)
    return result
