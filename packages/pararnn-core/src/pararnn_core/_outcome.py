"""How a Newton solve ends, shared by the unfused solver and the fused layer path.

Either the residuals stayed finite and below ``divergence_threshold`` (the stats record the final
residual and whether it met the tolerance), or the solve diverged: raise
:class:`~pararnn_core.NewtonDivergenceError`, or, with ``on_divergence="sequential"``, recompute
the layer step by step, measure that recomputation's residual, and never return non-finite
states.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from ._validation import float_eps
from .cells.base import ParaCell
from .config import DeferredNewtonStats, NewtonConfig, NewtonDivergenceError, NewtonStats

__all__ = [
    "capturing",
    "conclude_before_gradients",
    "conclude_solve",
    "deferred_conclusion",
    "max_abs",
    "read_later",
    "refuse_while_capturing",
    "shift_states",
]


def shift_states(states: Tensor, h0: Tensor) -> Tensor:
    """``[h0, h_1, ..., h_{T-1}]``: the state each step consumes. ``[B, T, *S]``."""
    return torch.cat([h0.unsqueeze(1), states[:, :-1]], dim=1)


def max_abs(x: Tensor) -> Tensor:
    """``max |x|`` as a float64 scalar tensor; amax propagates NaN, so a NaN shows up."""
    return x.abs().amax().double()


def _judged(
    config: NewtonConfig,
    dtype: torch.dtype,
    iters: int,
    history: tuple[float, ...],
    final_residual: float,
    label: str,
) -> NewtonStats | None:
    """The stats of a solve whose residuals stayed finite and within the threshold, else None."""
    threshold = config.divergence_threshold
    if all(math.isfinite(v) and v <= threshold for v in (*history, final_residual)):
        tol = config.tol if config.tol is not None else math.sqrt(float_eps(dtype))
        return NewtonStats(iters, final_residual, history, label, final_residual <= tol)
    return None


def _where(cell: ParaCell, u: Tensor, label: str, detail: str) -> str:
    return (
        f" in a {type(cell).__name__} layer (B={u.shape[0]}, T={u.shape[1]}, scan backend "
        f"{label!r}{detail})"
    )


def conclude_solve(
    cell: ParaCell,
    config: NewtonConfig,
    u: Tensor,
    h0: Tensor,
    states: Tensor,
    *,
    iters: int,
    history: tuple[float, ...],
    final_residual: float,
    label: str,
    recompute: Callable[[], Tensor],
    detail: str = "",
) -> tuple[Tensor, NewtonStats]:
    """The states and stats of a finished solve, or the divergence handling of DESIGN §1.

    Args:
        cell, config, u, h0: the layer and its inputs (``u [B, T, d_u]``, ``h0 [B, *S]``).
        states: ``[B, T, *S]`` the solver's result.
        iters, history: updates run and the max residual per iteration.
        final_residual: the largest residual the returned states leave.
        label: the backend that ran (``NewtonStats.backend``).
        recompute: the step-by-step recurrence, run only after a divergence.
        detail: extra words for the error message.

    Raises:
        NewtonDivergenceError: diverged and ``on_divergence="raise"``, or the sequential
            recomputation is not finite either.
    """
    stats = _judged(config, states.dtype, iters, history, final_residual, label)
    if stats is not None:
        return states, stats
    threshold = config.divergence_threshold
    where = _where(cell, u, label, detail)
    if config.on_divergence == "raise":
        raise NewtonDivergenceError(history, threshold, where)
    with torch.no_grad():
        states = recompute()
        final = max_abs(cell.step(shift_states(states, h0), u) - states).item()
    if not math.isfinite(final) or not bool(torch.isfinite(states).all()):
        raise NewtonDivergenceError(
            history, threshold, where + "; the sequential recomputation is not finite either"
        )
    return states, NewtonStats(iters, final, history, label, False, fallback="sequential")


def capturing(device: torch.device) -> bool:
    """Whether the current CUDA stream is capturing a graph (False off CUDA)."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def refuse_while_capturing(config: NewtonConfig, u: Tensor, *, unfused: bool) -> None:
    """Raise a clear error when a CUDA graph is being captured and the solve would wait for
    the device: ``stats`` other than ``"device"``, or ``tol`` on the unfused path (which reads
    every iteration's residual back)."""
    if not capturing(u.device):
        return
    if config.stats != "device":
        raise RuntimeError(
            "capturing a CUDA graph needs NewtonConfig(stats='device'): stats="
            f"{config.stats!r} waits for the device's statistics (in the forward for 'sync', "
            "in the backward for 'deferred'), which a graph cannot hold"
        )
    if unfused and config.tol is not None:
        raise RuntimeError(
            "capturing a CUDA graph needs NewtonConfig(tol=None) on the unfused Newton path "
            f"(scan_backend={config.scan_backend!r}): tol={config.tol!r} reads every "
            "iteration's residual back to the host; the fused kernels (scan_backend='fused') "
            "stop at tol on the device"
        )


def read_later(values: Tensor, *, live: bool = False) -> Callable[[], list[float]]:
    """``values.tolist()`` later, without waiting for the device now.

    On CUDA a non-blocking copy to host memory and an event are queued behind the work that
    computes ``values``; the returned function waits on the event (once the device is past it,
    not at all) and reads the copy. Elsewhere the values are read when asked for (the host has
    computed them already). ``live`` (``stats="device"``): nothing is queued; each call reads
    ``values`` from the device as they are then (in a CUDA graph, the latest replay's).
    """
    if live or values.device.type != "cuda":
        return values.detach().tolist
    host = values.detach().to("cpu", non_blocking=True)
    copied = torch.cuda.Event()  # type: ignore[no-untyped-call]
    copied.record()

    def read() -> list[float]:
        copied.synchronize()
        return host.tolist()

    return read


def deferred_conclusion(
    cell: ParaCell,
    config: NewtonConfig,
    u: Tensor,
    dtype: torch.dtype,
    *,
    label: str,
    summary: Callable[[], tuple[int, tuple[float, ...], float]],
    detail: str = "",
) -> DeferredNewtonStats:
    """Stats that conclude the solve (as :func:`conclude_solve` with ``on_divergence="raise"``)
    when read (``config.stats``: ``"deferred"`` once, ``"device"`` at every read):
    ``summary()`` gives ``(iters, history, final_residual)`` through :func:`read_later`. Holds
    no tensor of the layer but the few statistics (``dtype`` and the words of the message are
    taken now)."""
    where = _where(cell, u, label, detail)

    def resolve() -> NewtonStats:
        iters, history, final_residual = summary()
        stats = _judged(config, dtype, iters, history, final_residual, label)
        if stats is None:
            raise NewtonDivergenceError(history, config.divergence_threshold, where)
        return stats

    return DeferredNewtonStats(resolve, live=config.stats == "device")


def conclude_before_gradients(stats: NewtonStats) -> None:
    """Take deferred stats in (:class:`DeferredNewtonStats`; sync stats are concluded already).

    A layer's backward calls this after it has queued its device work and before it returns any
    gradient: a diverged solve raises :class:`NewtonDivergenceError` there, so none of its
    gradients is handed on, while the device already has the backward's work to run during the
    wait for the forward's statistics. Live stats (``stats="device"``) are not read: that mode
    waits for nothing.
    """
    if isinstance(stats, DeferredNewtonStats) and not stats.live:
        stats.resolved()
