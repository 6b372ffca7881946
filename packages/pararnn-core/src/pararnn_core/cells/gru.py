"""ParaGRU: a GRU with per-channel (diagonal) recurrent weights; its Jacobian is diagonal."""

from __future__ import annotations

from typing import Final

import torch
from torch import Tensor, nn

from pararnn_kernels import scan_diag

from ..structures import Diag
from .base import ParaCell
from .projection import ProjectionLinear

__all__ = ["ParaGRU"]

#: Recurrent weights start uniform in ``[-RECURRENT_INIT, RECURRENT_INIT]`` (contraction bound below).
RECURRENT_INIT: Final = 0.25


class ParaGRU(ParaCell):
    r"""GRU with diagonal recurrent weights (one scalar per channel and gate).

    Equations (``⊙`` elementwise, ``σ`` the logistic function; ``u = W_x x + b`` is one ``Linear``
    from ``d_in`` to the three gates ``[u_z, u_r, u_c]``)::

        z_t = σ(u_z + a_z ⊙ h_{t-1})                  update gate
        r_t = σ(u_r + a_r ⊙ h_{t-1})                  reset gate
        c_t = tanh(u_c + a_c ⊙ r_t ⊙ h_{t-1})         candidate
        h_t = (1 - z_t) ⊙ h_{t-1} + z_t ⊙ c_t

    State ``h [B, d_h]``; structure ``Diag``: ``∂h_t/∂h_{t-1}`` is the diagonal::

        J = (1 - z) + z(1 - z) a_z (c - h) + z (1 - c²) a_c (r + r(1 - r) a_r h)

    Initialisation: ``W_x``, ``b`` as ``nn.Linear``; ``a_z, a_r, a_c ~ U(-0.25, 0.25)``. For states in
    ``[-1, 1]`` (all states are, from a state in ``[-1, 1]``) the bound
    ``|J| ≤ 1 - z (1 - ρ)`` with ``ρ = |a_c| (1 + |a_r|/4) + 2|a_z| ≤ 0.77`` holds, so every step is
    a contraction at the start of training and Newton converges in a few iterations.

    Args:
        d_in: input features.
        d_h: hidden channels.
        device, dtype: as for ``torch.nn`` modules.

    Parameters:
        proj: ``ProjectionLinear(d_in, 3 * d_h)`` (an ``nn.Linear``; its ``backend``
            picks the GEMM), gate order ``(z, r, c)``.
        recurrent_weight: ``[3, d_h]`` rows ``(a_z, a_r, a_c)``.
    """

    def __init__(
        self,
        d_in: int,
        d_h: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(d_in=d_in, d_h=d_h, d_u=3 * d_h, structure=Diag())
        self.proj = ProjectionLinear(d_in, 3 * d_h, device=device, dtype=dtype)
        self.recurrent_weight = nn.Parameter(torch.empty(3, d_h, device=device, dtype=dtype))
        self.reset_recurrent_parameters()

    def reset_recurrent_parameters(self) -> None:
        """Re-draw the diagonal recurrent weights (the contracting init above)."""
        with torch.no_grad():
            self.recurrent_weight.uniform_(-RECURRENT_INIT, RECURRENT_INIT)

    def project(self, x: Tensor) -> Tensor:
        """``[..., d_in] -> [..., 3 d_h]``: the pre-activations ``[u_z, u_r, u_c]``."""
        out: Tensor = self.proj(x)
        return out

    def _gates(self, h: Tensor, u: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        a_z, a_r, a_c = self.recurrent_weight
        u_z, u_r, u_c = torch.split(u, self.d_h, dim=-1)
        z = torch.sigmoid(u_z + a_z * h)
        r = torch.sigmoid(u_r + a_r * h)
        c = torch.tanh(u_c + a_c * r * h)
        return z, r, c

    def step(self, h_prev: Tensor, u: Tensor) -> Tensor:
        """``h_t`` from ``h_prev [..., d_h]`` and ``u [..., 3 d_h]``."""
        z, _r, c = self._gates(h_prev, u)
        return h_prev + z * (c - h_prev)

    def step_and_jacobian(self, h_prev: Tensor, u: Tensor) -> tuple[Tensor, Tensor]:
        """``h_t`` and the diagonal ``∂h_t/∂h_{t-1}``, both ``[..., d_h]``."""
        a_z, a_r, a_c = self.recurrent_weight
        z, r, c = self._gates(h_prev, u)
        gap = c - h_prev
        jac = (
            (1 - z)
            + z * (1 - z) * a_z * gap
            + z * (1 - c * c) * a_c * (r + r * (1 - r) * a_r * h_prev)
        )
        return h_prev + z * gap, jac

    def uncoupled_states(self, u: Tensor, h0: Tensor) -> Tensor:
        """``h_t = (1 - σ(u_z)) h_{t-1} + σ(u_z) tanh(u_c)`` (the recurrent weights dropped) from
        ``h0 [B, d_h]``, one linear scan: ``u [B, T, 3 d_h] -> [B, T, d_h]``."""
        u_z, _u_r, u_c = torch.split(u, self.d_h, dim=-1)
        z = torch.sigmoid(u_z)
        return scan_diag(1 - z, z * torch.tanh(u_c), h0.to(u.dtype)).to(h0.dtype)
