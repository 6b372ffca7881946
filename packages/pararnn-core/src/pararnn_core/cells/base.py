"""The cell protocol: what a recurrent cell tells the Newton solver.

A cell is an ``nn.Module`` subclass of :class:`ParaCell`. It declares its output width ``d_h``, the
width ``d_u`` of its projected input and its Jacobian :mod:`structure <pararnn_core.structures>`,
and writes two functions:

* :meth:`ParaCell.project` -- the input projection ``u = W_x x + b`` for all steps at once
  (``[..., d_in] -> [..., d_u]``, one matmul, outside the recurrence);
* :meth:`ParaCell.step` -- the one-step update ``h_t = f(h_{t-1}, u_t)`` on any leading axes.

Everything else has a default: the Jacobian ``∂f/∂h`` is derived with forward-mode ``torch.func.jvp``
(one JVP for ``Diag``, ``k`` for ``Block(k)``, ``D`` for ``Dense``), the VJP used by the backward
pass runs autograd through :meth:`step` with the parameters given explicitly
(``torch.func.functional_call``), the output is the state (``Diag``, ``Dense``) or the last block
component (``Block``), and the initial state is zeros. Built-in cells override
:meth:`step_and_jacobian` with the analytic Jacobian. ``docs/cells.md`` has a worked example.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import torch
from torch import Tensor, nn

from ..structures import Block, Dense, Diag, Structure

__all__ = ["CellVJP", "ParaCell", "derive_jacobian"]


class CellVJP(NamedTuple):
    """Cotangents of one batched cell step, ``μᵀ ∂f/∂(h_prev, u, θ)``.

    Attributes:
        grad_h_prev: like ``h_prev``.
        grad_u: like ``u``.
        grad_params: one entry per parameter name given to :meth:`ParaCell.vjp`; None where the step
            does not use that parameter (e.g. the input projection's weight).
    """

    grad_h_prev: Tensor
    grad_u: Tensor
    grad_params: dict[str, Tensor | None]


def derive_jacobian(
    step: object, h_prev: Tensor, u: Tensor, structure: Structure
) -> tuple[Tensor, Tensor]:
    """``(f(h_prev, u), ∂f/∂h)`` by forward-mode AD, in the storage layout of ``structure``.

    The structure is trusted: for ``Diag`` one JVP with a tangent of ones gives the diagonal (and
    would silently sum the rows of a Jacobian that is not diagonal); ``Block(k)`` takes one JVP per
    block column, ``Dense`` one per state channel.

    Args:
        step: ``(h_prev, u) -> h``, batched over leading axes.
        h_prev: ``[..., D]`` (Diag, Dense) or ``[..., D, k]`` (Block).
        u: ``[..., d_u]``.
        structure: the declared structure.

    Returns:
        ``h`` like ``h_prev`` and the Jacobian ``[..., D]``, ``[..., D, k, k]`` or ``[..., D, D]``.
    """
    if not callable(step):
        raise TypeError(f"step must be callable, got {type(step).__name__}")

    def f(h: Tensor) -> Tensor:
        out: Tensor = step(h, u)
        return out

    def jvp(tangent: Tensor) -> tuple[Tensor, Tensor]:
        result = torch.func.jvp(f, (h_prev,), (tangent,))
        return result[0], result[1]

    if isinstance(structure, Diag):
        return jvp(torch.ones_like(h_prev))
    if isinstance(structure, Block):
        columns = []
        out = h_prev
        for j in range(structure.k):
            tangent = torch.zeros_like(h_prev)
            tangent[..., j] = 1
            out, column = jvp(tangent)
            columns.append(column)
        return out, torch.stack(columns, dim=-1)
    columns = []
    out = h_prev
    for j in range(h_prev.shape[-1]):
        tangent = torch.zeros_like(h_prev)
        tangent[..., j] = 1
        out, column = jvp(tangent)
        columns.append(column)
    return out, torch.stack(columns, dim=-1)


class ParaCell(nn.Module):
    """Base class of recurrent cells solved by Newton (the cell protocol).

    Subclasses call ``super().__init__(d_in=..., d_h=..., d_u=..., structure=...)``, create their
    parameters, and implement :meth:`project` and :meth:`step`. Optionally they override
    :meth:`jacobian` (analytic ``∂f/∂h``), :meth:`step_and_jacobian` (both, sharing work),
    :meth:`vjp`, :meth:`output`, :meth:`initial_state` and :meth:`uncoupled_states`.

    Shapes (``S`` = :attr:`state_shape`: ``(d_h,)`` for Diag and Dense, ``(d_h, k)`` for Block(k)):

    * ``x [B, T, d_in]`` --project--> ``u [B, T, d_u]``;
    * ``step(h_prev [..., *S], u [..., d_u]) -> h [..., *S]``;
    * ``jacobian(h_prev, u) -> [..., d_h]`` / ``[..., d_h, k, k]`` / ``[..., d_h, d_h]``;
    * ``output(h [..., *S]) -> [..., d_h]``.

    Calling the module, ``cell(h_prev, u)``, is :meth:`step` (so ``torch.func.functional_call`` can
    evaluate it with explicitly given parameters).

    Args:
        d_in: input features.
        d_h: output features (= channels of the state).
        d_u: features of the projected input ``u``.
        structure: :class:`~pararnn_core.Diag`, :class:`~pararnn_core.Block` or
            :class:`~pararnn_core.Dense`.
    """

    d_in: int
    d_h: int
    d_u: int
    structure: Structure

    def __init__(self, *, d_in: int, d_h: int, d_u: int, structure: Structure) -> None:
        super().__init__()
        for name, value in (("d_in", d_in), ("d_h", d_h), ("d_u", d_u)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not isinstance(structure, Diag | Block | Dense):
            raise TypeError(
                f"structure must be Diag(), Block(k) or Dense(), got {type(structure).__name__}"
            )
        self.d_in = d_in
        self.d_h = d_h
        self.d_u = d_u
        self.structure = structure

    # -- shapes ---------------------------------------------------------------------------------

    @property
    def state_shape(self) -> tuple[int, ...]:
        """One state without the batch axis: ``(d_h,)`` or ``(d_h, k)``."""
        return self.structure.state_shape(self.d_h)

    @property
    def jacobian_shape(self) -> tuple[int, ...]:
        """One step's Jacobian without the batch axis (see :mod:`pararnn_core.structures`)."""
        return self.structure.jacobian_shape(self.d_h)

    # -- the protocol ---------------------------------------------------------------------------

    def project(self, x: Tensor) -> Tensor:
        """Input projection for all steps at once: ``[..., d_in] -> [..., d_u]``."""
        raise NotImplementedError(f"{type(self).__name__} must implement project(x)")

    def step(self, h_prev: Tensor, u: Tensor) -> Tensor:
        """One-step update ``h = f(h_prev, u)``: ``[..., *S], [..., d_u] -> [..., *S]``."""
        raise NotImplementedError(f"{type(self).__name__} must implement step(h_prev, u)")

    def jacobian(self, h_prev: Tensor, u: Tensor) -> Tensor:
        """``∂f/∂h`` at ``(h_prev, u)`` in the structure's layout (derived unless overridden)."""
        return self.step_and_jacobian(h_prev, u)[1]

    def step_and_jacobian(self, h_prev: Tensor, u: Tensor) -> tuple[Tensor, Tensor]:
        """``(f(h_prev, u), ∂f/∂h(h_prev, u))``; Newton calls this once per iteration.

        Default: :meth:`step` and an overridden :meth:`jacobian`, or :func:`derive_jacobian`.
        """
        if type(self).jacobian is not ParaCell.jacobian:
            return self.step(h_prev, u), self.jacobian(h_prev, u)
        return derive_jacobian(self.step, h_prev, u, self.structure)

    def vjp(
        self, h_prev: Tensor, u: Tensor, grad_h: Tensor, params: Mapping[str, Tensor]
    ) -> CellVJP:
        """``grad_hᵀ ∂f/∂(h_prev, u, params)`` for a batch of steps, with ``params`` used in place
        of the module's own (so the Newton ``autograd.Function`` differentiates its explicit inputs).

        Args:
            h_prev: ``[..., *S]`` states each step consumed.
            u: ``[..., d_u]`` projected inputs.
            grad_h: ``[..., *S]`` cotangent of the step's output (the adjoint ``μ``).
            params: name -> tensor, a subset of ``dict(self.named_parameters())``.
        """
        with torch.enable_grad():
            h_leaf = h_prev.detach().requires_grad_(True)
            u_leaf = u.detach().requires_grad_(True)
            leaves = {name: p.detach().requires_grad_(True) for name, p in params.items()}
            out = torch.func.functional_call(self, leaves, (h_leaf, u_leaf))
            grads = torch.autograd.grad(
                out, [h_leaf, u_leaf, *leaves.values()], grad_h, allow_unused=True
            )
        grad_h_prev = torch.zeros_like(h_prev) if grads[0] is None else grads[0]
        grad_u = torch.zeros_like(u) if grads[1] is None else grads[1]
        return CellVJP(grad_h_prev, grad_u, dict(zip(leaves, grads[2:], strict=True)))

    def output(self, h: Tensor) -> Tensor:
        """The cell's output from its state: ``[..., *S] -> [..., d_h]``.

        Default: the state itself (Diag, Dense) or its last block component (Block).
        """
        if isinstance(self.structure, Block):
            return h[..., -1]
        return h

    def initial_state(
        self, batch: int, *, device: torch.device | None = None, dtype: torch.dtype | None = None
    ) -> Tensor:
        """The state used when no ``h0`` is given: zeros ``[batch, *S]`` unless overridden."""
        return torch.zeros(batch, *self.state_shape, device=device, dtype=dtype)

    def uncoupled_states(self, u: Tensor, h0: Tensor) -> Tensor:
        """The states of the cell with its couplings to the previous state that make the step
        nonlinear dropped, solved exactly from ``h0``: Newton's initial guess for
        ``NewtonConfig(initial_guess="uncoupled")``. ``u [B, T, d_u]``, ``h0 [B, *S]`` ->
        ``[B, T, *S]`` in ``h0``'s dtype.

        Optional: a cell whose state has a memory that does not depend on ``h`` (a gate of the
        inputs alone times the previous state) can solve that part by a linear scan, which a
        guess from one step cannot know; Newton then starts about one update closer. ParaGRU,
        ParaLSTM and ParaSLSTM define it.
        """
        raise NotImplementedError(
            f"{type(self).__name__} does not define uncoupled_states(u, h0), which "
            f"initial_guess='uncoupled' needs; use initial_guess='step'"
        )

    def forward(self, h_prev: Tensor, u: Tensor) -> Tensor:
        """Same as :meth:`step`."""
        return self.step(h_prev, u)

    def extra_repr(self) -> str:
        return f"d_in={self.d_in}, d_h={self.d_h}, structure={self.structure}"
