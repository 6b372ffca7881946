"""The parallel Newton solver, its ``autograd.Function`` with the eq. 2.6 backward, and the
sequential recurrence it is checked against (DESIGN §1).

Forward (no autograd graph): ``h^0_t = f(s, u_t)``; each iteration evaluates the cell and its
Jacobian at the shifted trajectory ``H_prev = [h0, h_1, ..., h_{T-1}]``, forms the residual
``r_t = f(h_{t-1}, u_t) - h_t``, solves ``δ_t = J_t δ_{t-1} + r_t`` (``δ_{-1} = 0``) with the
configured scan backend, and updates ``H <- H + ω δ``.

Backward: with ``g = ∂L/∂H``, one reverse scan ``μ_t = g_t + J_{t+1}ᵀ μ_{t+1}`` (J at the converged
H) and one batched VJP of the cell step at ``(H_prev, u)`` give ``∂L/∂u``, ``∂L/∂h0 = J_1ᵀ μ_1``
(the VJP's ``h_prev`` cotangent at t = 0) and every parameter's gradient. No Newton in backward, no
stored iterates: the Function saves ``u``, ``h0``, the converged ``H`` and the parameters.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ._outcome import (
    conclude_before_gradients,
    conclude_solve,
    deferred_conclusion,
    max_abs,
    read_later,
    refuse_while_capturing,
    shift_states,
)
from ._validation import check_cell, check_sequence, check_state
from .backends import get_scan_backend, resolved_scan_backend_name
from .cells.base import ParaCell
from .config import NewtonConfig, NewtonStats
from .fused import fused_method, fused_newton_apply
from .structures import Diag, Structure

__all__ = ["newton_apply", "newton_solve", "sequential_apply", "sequential_solve"]

_DEFAULT_CONFIG = NewtonConfig()


def _adjoint_jacobian(jac: Tensor, structure: Structure) -> Tensor:
    """``J_{t+1}ᵀ`` at step t (zero after the last step), the multiplier of the adjoint scan."""
    shifted = torch.cat([jac[:, 1:], torch.zeros_like(jac[:, :1])], dim=1)
    return shifted if isinstance(structure, Diag) else shifted.transpose(-1, -2)


def _initial_guess(cell: ParaCell, u: Tensor, h0: Tensor, config: NewtonConfig) -> Tensor:
    """Newton's starting trajectory ``H^0 [B, T, *S]`` (``config.initial_guess``), ``h0``'s dtype.

    Raises:
        ValueError: ``"uncoupled"`` for a cell that does not define ``uncoupled_states``, or
            one whose ``uncoupled_states`` returns another shape.
    """
    batch, steps = u.shape[:2]
    state_shape = tuple(h0.shape[1:])
    if config.initial_guess == "uncoupled":
        if type(cell).uncoupled_states is ParaCell.uncoupled_states:
            raise ValueError(
                f"initial_guess='uncoupled' needs a cell that defines uncoupled_states(u, h0); "
                f"{type(cell).__name__} does not (use initial_guess='step')"
            )
        guess = cell.uncoupled_states(u, h0)
        expected = (batch, steps, *state_shape)
        if tuple(guess.shape) != expected:
            raise ValueError(
                f"{type(cell).__name__}.uncoupled_states returned shape {tuple(guess.shape)}, "
                f"expected {expected}"
            )
        return guess.to(h0.dtype)
    empty = cell.initial_state(batch, device=u.device, dtype=h0.dtype)
    empty_seq = empty.unsqueeze(1).expand(batch, steps, *state_shape)
    return cell.step(empty_seq, u) if config.initial_guess == "step" else empty_seq.clone()


def sequential_solve(cell: ParaCell, u: Tensor, h0: Tensor) -> Tensor:
    """The recurrence one step at a time: ``u [B, T, d_u]``, ``h0 [B, *S]`` -> ``H [B, T, *S]``.

    Differentiable by ordinary autograd (back-propagation through time) when grad is enabled.
    """
    state = h0
    states = []
    for t in range(u.shape[1]):
        state = cell.step(state, u[:, t])
        states.append(state)
    return torch.stack(states, dim=1)


def newton_solve(
    cell: ParaCell, u: Tensor, h0: Tensor, config: NewtonConfig = _DEFAULT_CONFIG
) -> tuple[Tensor, NewtonStats]:
    """Solve ``h_t = f(h_{t-1}, u_t)`` for all t by Newton, without an autograd graph.

    Args:
        cell: the cell (its parameters are read directly).
        u: ``[B, T, d_u]`` projected inputs.
        h0: ``[B, *S]`` initial state.
        config: the solver settings.

    Returns:
        ``H [B, T, *S]`` and the :class:`NewtonStats` (a :class:`DeferredNewtonStats` with
        ``config.stats`` ``"deferred"`` or ``"device"``).

    Raises:
        NewtonDivergenceError: the residual exceeded ``config.divergence_threshold`` or became
            non-finite and ``config.on_divergence == "raise"`` (or the sequential recomputation
            is not finite either); with ``config.stats == "deferred"`` from the stats' first
            read or the backward instead, with ``"device"`` from a read of the stats.
        ValueError: ``scan_backend="fused"`` (a whole-layer path: :func:`newton_apply` runs it).
        RuntimeError: a CUDA graph is being captured and the solve would wait for the device
            (``stats`` not ``"device"``, or ``tol`` set).
    """
    refuse_while_capturing(config, u, unfused=True)
    backend = get_scan_backend(config.scan_backend)
    structure = cell.structure
    threshold = config.divergence_threshold
    with torch.no_grad():
        states = _initial_guess(cell, u, h0, config)
        label = resolved_scan_backend_name(config.scan_backend, states, structure)
        residuals: list[Tensor] = []
        iters = 0
        for it in range(config.max_iters + 1):
            prev = shift_states(states, h0)
            last = it == config.max_iters
            if last:
                f_val, jac = cell.step(prev, u), None
            else:
                f_val, jac = cell.step_and_jacobian(prev, u)
            residual = f_val - states
            residuals.append(max_abs(residual))
            if config.tol is not None:
                value = residuals[-1].item()  # the host sync that tol costs
                if not math.isfinite(value) or value > threshold or value <= config.tol:
                    break
            if jac is None:
                break
            delta = backend(jac, residual, None, reverse=False, structure=structure)
            states = states + config.omega * delta if config.omega != 1.0 else states + delta
            iters += 1
        stacked = torch.stack(residuals)
    if config.stats != "sync":
        read = read_later(stacked, live=config.stats == "device")

        def summary() -> tuple[int, tuple[float, ...], float]:
            values = tuple(float(v) for v in read())
            return iters, values, values[-1]

        stats = deferred_conclusion(cell, config, u, states.dtype, label=label, summary=summary)
        return states, stats
    history = tuple(float(v) for v in stacked.tolist())
    return conclude_solve(
        cell,
        config,
        u,
        h0,
        states,
        iters=iters,
        history=history,
        final_residual=history[-1],
        label=label,
        recompute=lambda: sequential_solve(cell, u, h0),
    )


class _NewtonFunction(torch.autograd.Function):
    """``H = solve(u, h0; θ)`` with the eq. 2.6 backward; θ are explicit inputs (DDP/FSDP hooks)."""

    @staticmethod
    def forward(
        ctx: Any,
        cell: ParaCell,
        config: NewtonConfig,
        names: tuple[str, ...],
        stats_out: list[NewtonStats],
        u: Tensor,
        h0: Tensor,
        *params: Tensor,
    ) -> Tensor:
        states, stats = newton_solve(cell, u, h0, config)
        stats_out.append(stats)
        ctx.stats = stats
        ctx.cell = cell
        ctx.config = config
        ctx.names = names
        ctx.save_for_backward(u, h0, states, *params)
        return states

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_states: Tensor) -> tuple[Tensor | None, ...]:
        u, h0, states, *params = ctx.saved_tensors
        cell: ParaCell = ctx.cell
        structure = cell.structure
        backend = get_scan_backend(ctx.config.scan_backend)
        prev = shift_states(states, h0)
        jac = cell.jacobian(prev, u)
        mu = backend(
            _adjoint_jacobian(jac, structure),
            grad_states.contiguous(),
            None,
            reverse=True,
            structure=structure,
        )
        need_u, need_h0 = ctx.needs_input_grad[4], ctx.needs_input_grad[5]
        need_params = ctx.needs_input_grad[6:]
        wanted = {
            name: p for name, p, need in zip(ctx.names, params, need_params, strict=True) if need
        }
        vjp = cell.vjp(prev, u, mu, wanted)
        grad_params = [vjp.grad_params.get(name) for name in ctx.names]
        conclude_before_gradients(ctx.stats)
        return (
            None,
            None,
            None,
            None,
            vjp.grad_u if need_u else None,
            vjp.grad_h_prev[:, 0] if need_h0 else None,
            *grad_params,
        )


def newton_apply(
    cell: ParaCell,
    x: Tensor,
    h0: Tensor | None = None,
    *,
    config: NewtonConfig = _DEFAULT_CONFIG,
) -> tuple[Tensor, NewtonStats]:
    """Run a cell over a sequence by parallel Newton; differentiable by eq. 2.6.

    Args:
        cell: a :class:`~pararnn_core.ParaCell`.
        x: ``[B, T, d_in]`` inputs (the cell's dtype and device).
        h0: ``[B, *S]`` initial state (``[B, d_h]`` for diagonal cells, ``[B, d_h, k]`` for block
            cells), or None for the cell's empty state.
        config: solver settings.

    Returns:
        ``states [B, T, *S]`` (``cell.output(states)`` is the ``[B, T, d_h]`` output,
        ``states[:, -1]`` the final state) and the solve's :class:`NewtonStats`. Gradients flow
        to ``x`` (through ``cell.project``), ``h0`` and every parameter.

    Raises:
        TypeError, ValueError: bad ``x`` or ``h0`` (the message names it).
        NewtonDivergenceError: see :class:`~pararnn_core.NewtonConfig`.
        RuntimeError: a CUDA graph is being captured and the solve would wait for the device
            (see ``NewtonConfig.stats``).

    Example:
        >>> import torch, pararnn_core as pc
        >>> cell = pc.ParaGRU(4, 8)
        >>> states, stats = pc.newton_apply(cell, torch.randn(2, 64, 4))
        >>> states.shape, stats.iters
        (torch.Size([2, 64, 8]), 3)
    """
    cell = check_cell(cell)
    if not isinstance(config, NewtonConfig):
        raise TypeError(f"config must be a NewtonConfig, got {type(config).__name__}")
    x = check_sequence(cell, x)
    h0_t = check_state(cell, h0, x.shape[0], x)
    u = cell.project(x)
    method = fused_method(cell, u, config)
    refuse_while_capturing(config, u, unfused=method is None)
    if method is not None:
        return fused_newton_apply(cell, u, h0_t, config, method)
    named = list(cell.named_parameters())
    names = tuple(name for name, _ in named)
    stats_out: list[NewtonStats] = []
    states: Tensor = _NewtonFunction.apply(
        cell, config, names, stats_out, u, h0_t, *(p for _, p in named)
    )
    return states, stats_out[0]


def sequential_apply(cell: ParaCell, x: Tensor, h0: Tensor | None = None) -> Tensor:
    """Run a cell over a sequence one step at a time (the reference; BPTT by autograd).

    Args:
        cell: a :class:`~pararnn_core.ParaCell`.
        x: ``[B, T, d_in]`` inputs.
        h0: ``[B, *S]`` initial state or None for the cell's empty state.

    Returns:
        ``states [B, T, *S]``, as :func:`newton_apply` returns them.
    """
    cell = check_cell(cell)
    x = check_sequence(cell, x)
    h0_t = check_state(cell, h0, x.shape[0], x)
    return sequential_solve(cell, cell.project(x), h0_t)
