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
from .config import NewtonConfig, NewtonDivergenceError, NewtonStats

__all__ = ["conclude_solve", "max_abs", "shift_states"]


def shift_states(states: Tensor, h0: Tensor) -> Tensor:
    """``[h0, h_1, ..., h_{T-1}]``: the state each step consumes. ``[B, T, *S]``."""
    return torch.cat([h0.unsqueeze(1), states[:, :-1]], dim=1)


def max_abs(x: Tensor) -> Tensor:
    """``max |x|`` as a float64 scalar tensor; amax propagates NaN, so a NaN shows up."""
    return x.abs().amax().double()


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
    threshold = config.divergence_threshold
    if all(math.isfinite(v) and v <= threshold for v in (*history, final_residual)):
        tol = config.tol if config.tol is not None else math.sqrt(float_eps(states.dtype))
        stats = NewtonStats(iters, final_residual, history, label, final_residual <= tol)
        return states, stats
    where = (
        f" in a {type(cell).__name__} layer (B={u.shape[0]}, T={u.shape[1]}, scan backend "
        f"{label!r}{detail})"
    )
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
