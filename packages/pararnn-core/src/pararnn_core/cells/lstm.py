"""ParaLSTM: an LSTM with a coupled input/forget gate, peepholes and diagonal recurrent weights."""

from __future__ import annotations

from typing import Final

import torch
from torch import Tensor, nn

from pararnn_kernels import scan_diag

from ..structures import Block
from .base import ParaCell
from .projection import ProjectionLinear

__all__ = ["ParaLSTM"]

#: Recurrent and peephole weights start uniform in ``[-RECURRENT_INIT, RECURRENT_INIT]``.
RECURRENT_INIT: Final = 0.25


class ParaLSTM(ParaCell):
    r"""LSTM with coupled input/forget gate (``i = 1 - f``), peepholes, diagonal recurrent weights.

    Equations (``u = W_x x + b`` is one ``Linear`` from ``d_in`` to ``[u_f, u_z, u_o]``)::

        f_t = σ(u_f + a_f ⊙ h_{t-1} + p_f ⊙ c_{t-1})      forget gate (input gate 1 - f_t)
        z_t = tanh(u_z + a_z ⊙ h_{t-1})                    cell input
        c_t = f_t ⊙ c_{t-1} + (1 - f_t) ⊙ z_t
        o_t = σ(u_o + a_o ⊙ h_{t-1} + p_o ⊙ c_t)           output gate, peephole on the new cell
        h_t = o_t ⊙ tanh(c_t)

    State per channel ``(c, h)``: ``[B, d_h, 2]`` with ``[..., 0] = c`` and ``[..., 1] = h`` (the
    output). Structure ``Block(2)``: per channel, with ``s_f = f(1 - f)``, ``s_o = o(1 - o)``::

        ∂c_t/∂c = f + s_f p_f (c - z)              ∂c_t/∂h = s_f a_f (c - z) + (1 - f)(1 - z²) a_z
        ∂h_t/∂x = s_o (∂õ/∂x) tanh(c_t) + o (1 - tanh²c_t) ∂c_t/∂x,
                  ∂õ/∂c = p_o ∂c_t/∂c,  ∂õ/∂h = a_o + p_o ∂c_t/∂h

    (rows ``(c_t, h_t)``, columns ``(c_{t-1}, h_{t-1})``).

    Initialisation: ``W_x``, ``b`` as ``nn.Linear``; ``a_f, a_z, a_o, p_f, p_o ~ U(-0.25, 0.25)``.
    States stay in ``[-1, 1]`` (``c_t`` is a convex combination of ``c_{t-1}`` and
    ``z_t ∈ (-1, 1)``), so ``|c - z| ≤ 2`` and each row of the block is its memory term (``f``,
    times ``o (1 - tanh² c_t)`` in the ``h`` row) plus terms of size ``O(0.25)``: the block is a
    contraction except where the forget gate saturates at 1, which the zero-mean pre-activations
    of the init avoid. Measured at init (unit-variance inputs, ``d_h = 64``, ``T = 512``): largest
    block ∞-norm ≈ 0.96, mean spectral radius ≈ 0.5 (``tests/core`` checks both stay below 1).

    Args:
        d_in: input features.
        d_h: hidden channels.
        device, dtype: as for ``torch.nn`` modules.

    Parameters:
        proj: ``ProjectionLinear(d_in, 3 * d_h)`` (an ``nn.Linear``; its ``backend``
            picks the GEMM), gate order ``(f, z, o)``.
        recurrent_weight: ``[3, d_h]`` rows ``(a_f, a_z, a_o)``.
        peephole_weight: ``[2, d_h]`` rows ``(p_f, p_o)``.
    """

    def __init__(
        self,
        d_in: int,
        d_h: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(d_in=d_in, d_h=d_h, d_u=3 * d_h, structure=Block(2))
        self.proj = ProjectionLinear(d_in, 3 * d_h, device=device, dtype=dtype)
        self.recurrent_weight = nn.Parameter(torch.empty(3, d_h, device=device, dtype=dtype))
        self.peephole_weight = nn.Parameter(torch.empty(2, d_h, device=device, dtype=dtype))
        self.reset_recurrent_parameters()

    def reset_recurrent_parameters(self) -> None:
        """Re-draw the diagonal recurrent and peephole weights (the contracting init above)."""
        with torch.no_grad():
            self.recurrent_weight.uniform_(-RECURRENT_INIT, RECURRENT_INIT)
            self.peephole_weight.uniform_(-RECURRENT_INIT, RECURRENT_INIT)

    def project(self, x: Tensor) -> Tensor:
        """``[..., d_in] -> [..., 3 d_h]``: the pre-activations ``[u_f, u_z, u_o]``."""
        out: Tensor = self.proj(x)
        return out

    def _forward(self, state: Tensor, u: Tensor) -> tuple[Tensor, ...]:
        a_f, a_z, a_o = self.recurrent_weight
        p_f, p_o = self.peephole_weight
        c, h = state[..., 0], state[..., 1]
        u_f, u_z, u_o = torch.split(u, self.d_h, dim=-1)
        f = torch.sigmoid(u_f + a_f * h + p_f * c)
        z = torch.tanh(u_z + a_z * h)
        c_new = z + f * (c - z)
        o = torch.sigmoid(u_o + a_o * h + p_o * c_new)
        tc = torch.tanh(c_new)
        return c, h, f, z, c_new, o, tc

    def step(self, h_prev: Tensor, u: Tensor) -> Tensor:
        """``(c_t, h_t)`` from ``h_prev [..., d_h, 2]`` and ``u [..., 3 d_h]``."""
        _c, _h, _f, _z, c_new, o, tc = self._forward(h_prev, u)
        return torch.stack([c_new, o * tc], dim=-1)

    def step_and_jacobian(self, h_prev: Tensor, u: Tensor) -> tuple[Tensor, Tensor]:
        """The new state ``[..., d_h, 2]`` and its 2x2 block Jacobian ``[..., d_h, 2, 2]``."""
        a_f, a_z, a_o = self.recurrent_weight
        p_f, p_o = self.peephole_weight
        c, _h, f, z, c_new, o, tc = self._forward(h_prev, u)
        s_f = f * (1 - f) * (c - z)
        dc_dc = f + s_f * p_f
        dc_dh = s_f * a_f + (1 - f) * (1 - z * z) * a_z
        s_o = o * (1 - o) * tc
        d_tanh = o * (1 - tc * tc)
        dh_dc = s_o * p_o * dc_dc + d_tanh * dc_dc
        dh_dh = s_o * (a_o + p_o * dc_dh) + d_tanh * dc_dh
        row_c = torch.stack([dc_dc, dc_dh], dim=-1)
        row_h = torch.stack([dh_dc, dh_dh], dim=-1)
        return torch.stack([c_new, o * tc], dim=-1), torch.stack([row_c, row_h], dim=-2)

    def uncoupled_states(self, u: Tensor, h0: Tensor) -> Tensor:
        """The couplings to ``h`` and the forget gate's peephole dropped, from ``h0 [B, d_h, 2]``:
        ``c_t = σ(u_f) c_{t-1} + (1 - σ(u_f)) tanh(u_z)`` (one linear scan), then
        ``h_t = σ(u_o + p_o c_t) tanh(c_t)``: ``u [B, T, 3 d_h] -> [B, T, d_h, 2]``."""
        _p_f, p_o = self.peephole_weight
        u_f, u_z, u_o = torch.split(u, self.d_h, dim=-1)
        f = torch.sigmoid(u_f)
        c = scan_diag(f, (1 - f) * torch.tanh(u_z), h0[..., 0].to(u.dtype))
        h = torch.sigmoid(u_o + p_o * c) * torch.tanh(c)
        return torch.stack([c, h], dim=-1).to(h0.dtype)
