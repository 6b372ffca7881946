"""The fused layer path: whole-layer kernels of :mod:`pararnn_kernels.fused` for built-in cells.

``NewtonConfig(scan_backend="fused")`` runs a layer's Newton solve as one fused kernel (chunks of
time solved on-chip from the exact state, DESIGN §4) and its eq. 2.6 backward as one fused reverse
pass; ``"auto"`` does the same on CUDA when the cell has fused kernels, or runs the fused
*sequential* kernel where the cost model says one step at a time is faster. The choice is in
:attr:`NewtonStats.backend`: ``"fused"`` or ``"fused_sequential"`` (then ``iters = 0`` and the
residual is recorded as 0: the states are the recurrence itself; non-finite states raise
:class:`~pararnn_core.NewtonDivergenceError`).

Cells with fused kernels (exactly these types, not subclasses, which may change the step):
:class:`~pararnn_core.ParaGRU` (diagonal), :class:`~pararnn_core.ParaLSTM` (2x2 blocks) and
:class:`~pararnn_core.ParaSLSTM` with ``mix="diag"`` (3x3 blocks). Other cells keep the unfused
path (``"auto"``) or raise a clear error (``"fused"``).

``"auto"``'s cost model is per cell (``pararnn_kernels.fused.choose_fused_{gru,lstm,slstm}_method``):
both fused paths cost at least the byte floor ``(G + k) · B·T·d · size / bandwidth`` (G gate
blocks read, k state components written); the sequential kernel adds ``T`` steps of 0.16 µs per
wave of programs (measured on the GRU, H200) times the cell's sequential work factor (GRU 1,
LSTM 1.33, sLSTM 1.94) and reaches the cell's share of the bandwidth (GRU 90 %, LSTM 70 %,
sLSTM 55 %), Newton adds 0.1 ms per call and its chunks at 6.5 µs per 128 steps per wave times
the cell's Newton work factor (GRU 1, LSTM 2.8, sLSTM 4.5; the block factors fitted to their
kernels' times on the same GPU).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from pararnn_kernels.fused import (
    FusedNewtonResult,
    check_fused_supported,
    choose_fused_gru_method,
    choose_fused_lstm_method,
    choose_fused_slstm_method,
    fused_gru_backward,
    fused_gru_newton,
    fused_gru_sequential,
    fused_lstm_backward,
    fused_lstm_newton,
    fused_lstm_sequential,
    fused_slstm_backward,
    fused_slstm_newton,
    fused_slstm_sequential,
    summarize_fused_stats,
)

from ._outcome import (
    conclude_before_gradients,
    conclude_solve,
    deferred_conclusion,
    read_later,
)
from ._validation import check_cell, check_sequence, check_state
from .cells.base import ParaCell
from .cells.gru import ParaGRU
from .cells.lstm import ParaLSTM
from .cells.slstm import ParaSLSTM
from .config import DeferredNewtonStats, NewtonConfig, NewtonDivergenceError, NewtonStats

__all__ = [
    "FusedMethod",
    "fused_kernels_apply",
    "fused_method",
    "fused_newton_apply",
    "fused_sequential_apply",
    "has_fused_kernels",
]

FusedMethod = Literal["fused", "fused_sequential"]

#: The cells the fused kernels serve, as the error messages name them.
_SERVED = "ParaGRU, ParaLSTM and ParaSLSTM(mix='diag')"


@dataclass(frozen=True)
class _CellKernels:
    """One cell's fused kernels, called with its recurrent parameters in ``params`` order.

    ``newton(u, *params, h0, **settings)``, ``backward(u, *params, h0, states, grad_states)``
    (returns ``grad_u, grad_h0, *grad_params``), ``sequential(u, *params, h0)`` and the cost
    model ``choose(B, T, d_h, device, dtype)``.
    """

    params: tuple[str, ...]
    newton: Callable[..., FusedNewtonResult]
    backward: Callable[..., tuple[Tensor, ...]]
    sequential: Callable[..., Tensor]
    choose: Callable[[int, int, int, torch.device, torch.dtype], Literal["newton", "sequential"]]


_GRU_KERNELS = _CellKernels(
    ("recurrent_weight",),
    fused_gru_newton,
    fused_gru_backward,
    fused_gru_sequential,
    choose_fused_gru_method,
)
_LSTM_KERNELS = _CellKernels(
    ("recurrent_weight", "peephole_weight"),
    fused_lstm_newton,
    fused_lstm_backward,
    fused_lstm_sequential,
    choose_fused_lstm_method,
)
_SLSTM_KERNELS = _CellKernels(
    ("recurrent_weight",),
    fused_slstm_newton,
    fused_slstm_backward,
    fused_slstm_sequential,
    choose_fused_slstm_method,
)


def _kernels_for(cell: ParaCell) -> _CellKernels | None:
    kind = type(cell)
    if kind is ParaGRU:
        return _GRU_KERNELS
    if kind is ParaLSTM:
        return _LSTM_KERNELS
    if kind is ParaSLSTM and getattr(cell, "mix", None) == "diag":
        return _SLSTM_KERNELS
    return None


def has_fused_kernels(cell: ParaCell) -> bool:
    """Whether ``cell`` has fused layer kernels: exactly the built-in :class:`ParaGRU`,
    :class:`ParaLSTM` or :class:`ParaSLSTM` with ``mix="diag"`` (not subclasses)."""
    return _kernels_for(cell) is not None


def _require_kernels(cell: ParaCell, what: str, instead: str) -> _CellKernels:
    kernels = _kernels_for(cell)
    if kernels is None:
        raise ValueError(
            f"{what} has kernels for {_SERVED}; got a {type(cell).__name__}: use {instead}"
        )
    return kernels


#: Cells whose fused kernels ``"auto"`` and the eval path pick by themselves: those whose kernels
#: have passed their CUDA tests and whose cost model was fitted to GPU times (all three built-in
#: cells with fused kernels). Kept as a tuple so that a cell whose kernels are new can be served
#: by ``scan_backend="fused"`` before ``"auto"`` picks it.
AUTO_FUSED_CELLS: Final[tuple[type[ParaCell], ...]] = (ParaGRU, ParaLSTM, ParaSLSTM)


def fused_kernels_apply(cell: ParaCell, u: Tensor) -> bool:
    """Whether ``"auto"`` (and ``.eval()``) run the fused kernels for ``cell`` on tensors like
    ``u``: a cell of :data:`AUTO_FUSED_CELLS`, CUDA, a supported dtype."""
    if not has_fused_kernels(cell) or type(cell) not in AUTO_FUSED_CELLS:
        return False
    try:
        check_fused_supported(u)
    except ValueError:
        return False
    return u.device.type == "cuda"


def fused_method(cell: ParaCell, u: Tensor, config: NewtonConfig) -> FusedMethod | None:
    """Which fused path ``config.scan_backend`` selects for ``cell`` on ``u [B, T, d_u]``.

    ``"fused"`` always gives the fused Newton kernel (or raises); ``"auto"`` gives the cell's
    cost-model pick (module docstring) on CUDA for cells with fused kernels and None otherwise
    (the unfused path); every other name gives None.

    Raises:
        ValueError: ``"fused"`` for a cell without fused kernels, or a device or dtype the
            kernels cannot serve (the message says which).
    """
    if config.scan_backend == "fused":
        _require_kernels(
            cell, "scan_backend='fused'", "scan_backend='auto' (the unfused Newton path)"
        )
        check_fused_supported(u)
        return "fused"
    if config.scan_backend == "auto" and fused_kernels_apply(cell, u):
        kernels = _kernels_for(cell)
        assert kernels is not None  # fused_kernels_apply checked it
        choice = kernels.choose(u.shape[0], u.shape[1], cell.d_h, u.device, u.dtype)
        return "fused" if choice == "newton" else "fused_sequential"
    return None


def _parameters(cell: ParaCell, kernels: _CellKernels) -> tuple[Tensor, ...]:
    return tuple(cell.get_parameter(name) for name in kernels.params)


class _FusedLayerFunction(torch.autograd.Function):
    """``states = layer(u, h0; params)`` by a fused kernel, backward by the fused eq. 2.6 pass.

    Every recurrent parameter the step uses (GRU and sLSTM: ``recurrent_weight``; LSTM:
    ``recurrent_weight`` and ``peephole_weight``) is an explicit input, so DDP/FSDP hooks see them
    as for a Linear; the input projection's parameters get their gradients through ``u`` by
    ordinary autograd.
    """

    @staticmethod
    def forward(
        ctx: Any,
        cell: ParaCell,
        kernels: _CellKernels,
        config: NewtonConfig,
        method: FusedMethod,
        stats_out: list[NewtonStats],
        u: Tensor,
        h0: Tensor,
        *params: Tensor,
    ) -> Tensor:
        if method == "fused_sequential":
            states = kernels.sequential(u, *params, h0)
            stats = _sequential_stats(cell, config, u, states)
        else:
            states, stats = _solve(cell, kernels, config, u, h0, params)
        stats_out.append(stats)
        ctx.kernels = kernels
        ctx.stats = stats
        ctx.save_for_backward(u, h0, states, *params)
        return states

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_states: Tensor) -> tuple[Tensor | None, ...]:
        u, h0, states, *params = ctx.saved_tensors
        kernels: _CellKernels = ctx.kernels
        grad_u, grad_h0, *grad_params = kernels.backward(u, *params, h0, states, grad_states)
        conclude_before_gradients(ctx.stats)
        needs = ctx.needs_input_grad
        return (
            None,
            None,
            None,
            None,
            None,
            grad_u if needs[5] else None,
            grad_h0 if needs[6] else None,
            *(g if need else None for g, need in zip(grad_params, needs[7:], strict=True)),
        )


def _sequential_stats(
    cell: ParaCell, config: NewtonConfig, u: Tensor, states: Tensor
) -> NewtonStats:
    """The fused sequential kernel's stats: its states are the recurrence itself, so only
    non-finite states count as a divergence. A non-finite value carries forward in time, so the
    last state shows any of them (one small read: one host sync, or a deferred one)."""
    finite = torch.isfinite(states[:, -1]).all()
    where = (
        f" in a {type(cell).__name__} layer (B={u.shape[0]}, T={u.shape[1]}): the fused "
        "sequential recurrence produced non-finite states"
    )
    threshold = config.divergence_threshold

    def conclude(is_finite: bool) -> NewtonStats:
        if not is_finite:
            raise NewtonDivergenceError((math.inf,), threshold, where)
        return NewtonStats(0, 0.0, (0.0,), "fused_sequential", True)

    if config.stats != "sync":
        live = config.stats == "device"
        read = read_later(finite.reshape(1), live=live)
        return DeferredNewtonStats(lambda: conclude(bool(read()[0])), live=live)
    return conclude(bool(finite))


def _solve(
    cell: ParaCell,
    kernels: _CellKernels,
    config: NewtonConfig,
    u: Tensor,
    h0: Tensor,
    params: tuple[Tensor, ...],
) -> tuple[Tensor, NewtonStats]:
    result = kernels.newton(
        u,
        *params,
        h0,
        max_iters=config.max_iters,
        tol=config.tol,
        omega=config.omega,
        initial_guess=config.initial_guess,
    )
    detail = f", {result.passes} pass(es)"
    if config.stats != "sync":
        # The summary holds the small stats, not the result (whose states it would keep).
        read = read_later(result.stats, live=config.stats == "device")
        stats = deferred_conclusion(
            cell,
            config,
            u,
            result.states.dtype,
            label="fused",
            summary=lambda: summarize_fused_stats(read()),
            detail=detail,
        )
        return result.states, stats
    return conclude_solve(
        cell,
        config,
        u,
        h0,
        result.states,
        iters=result.iters,
        history=result.residuals,
        final_residual=result.max_residual,
        label="fused",
        recompute=lambda: kernels.sequential(u, *params, h0),
        detail=detail,
    )


def fused_newton_apply(
    cell: ParaCell, u: Tensor, h0: Tensor, config: NewtonConfig, method: FusedMethod
) -> tuple[Tensor, NewtonStats]:
    """Run a layer on projected inputs ``u [B, T, d_u]`` from ``h0 [B, *S]`` by ``method``.

    Called by :func:`~pararnn_core.newton_apply` when :func:`fused_method` picks a fused path;
    differentiable in ``u``, ``h0`` and every recurrent parameter of the cell.

    Raises:
        ValueError: the cell has no fused kernels.
    """
    kernels = _require_kernels(
        cell, "the fused layer path", "newton_apply with scan_backend='auto'"
    )
    stats_out: list[NewtonStats] = []
    states: Tensor = _FusedLayerFunction.apply(
        cell, kernels, config, method, stats_out, u, h0, *_parameters(cell, kernels)
    )
    return states, stats_out[0]


def fused_sequential_apply(
    cell: ParaCell,
    x: Tensor,
    h0: Tensor | None = None,
    *,
    stats: Literal["sync", "deferred", "device"] = "device",
) -> Tensor:
    """Run a cell over a sequence one step at a time in one fused kernel.

    The fast ``.eval()`` path of :class:`~pararnn_core.ParaRNN` and the honest sequential
    baseline; differentiable (its backward is the fused eq. 2.6 pass, which equals BPTT).

    Args:
        cell: a cell with fused kernels (:func:`has_fused_kernels`).
        x: ``[B, T, d_in]`` inputs on CUDA (or CPU under ``TRITON_INTERPRET=1``).
        h0: ``[B, *S]`` initial state (``[B, d_h]`` for ParaGRU, ``[B, d_h, k]`` for the block
            cells), or None for the cell's empty state.
        stats: when non-finite states are looked for, as :class:`NewtonConfig`'s ``stats``
            (a non-finite value carries forward in time, so the last state shows any).
            ``"device"`` (default): never -- nothing waits for the device (eval, decoding, a
            CUDA graph). ``"sync"``: at the end of the forward, one host sync, raising
            :class:`NewtonDivergenceError` there, as a training layer with the default
            config does when ``scan_backend="auto"`` picks this kernel. ``"deferred"``: in the
            backward, after it has queued its device work and before it hands any gradient on
            (a forward with no backward is not checked).

    Returns:
        ``states [B, T, *S]``, as :func:`~pararnn_core.sequential_apply` returns them.

    Raises:
        ValueError: the cell has no fused kernels, the device/dtype cannot run them, or
            ``stats`` is not one of the three modes.
        NewtonDivergenceError: ``stats="sync"`` and a state is not finite.
    """
    cell = check_cell(cell)
    _require_kernels(cell, "fused_sequential_apply", "sequential_apply")
    x = check_sequence(cell, x)
    h0_t = check_state(cell, h0, x.shape[0], x)
    u = cell.project(x)
    check_fused_supported(u)
    # The states are the recurrence itself: the only statistic is whether they are finite.
    config = NewtonConfig(scan_backend="fused", stats=stats)
    states, _stats = fused_newton_apply(cell, u, h0_t, config, "fused_sequential")
    return states
