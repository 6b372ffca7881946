"""ParaSLSTM: the sLSTM of xLSTM with diagonal recurrent weights, in log-normaliser form."""

from __future__ import annotations

from typing import Final

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pararnn_kernels import scan_diag

from ..structures import Block
from .base import ParaCell
from .projection import ProjectionLinear

__all__ = ["EMPTY_LOG_NORMALISER", "ParaSLSTM"]

#: Recurrent weights start uniform in ``[-RECURRENT_INIT, RECURRENT_INIT]``.
RECURRENT_INIT: Final = 0.25
#: Forget-gate bias at init: ``σ(-2) ≈ 0.12``, a short memory that contracts strongly.
FORGET_BIAS_INIT: Final = -2.0
#: The input gate's rows of ``W_x`` and ``b`` start at this fraction of the ``nn.Linear`` init.
INPUT_GATE_INIT_SCALE: Final = 0.5
#: ``ℓ`` of the empty state (xLSTM's ``n_0 = 0``): ``exp(ℓ)`` underflows to 0 in every dtype, so
#: the first step gives ``λ_1 = 1`` exactly, as the zero-initialised sLSTM does.
EMPTY_LOG_NORMALISER: Final = -1.0e4


class ParaSLSTM(ParaCell):
    r"""sLSTM (Beck et al., xLSTM, 2024): exponential input gate, normaliser and stabiliser.

    xLSTM's stabilised recurrence, with ``ĩ, f̃, õ, z̃`` the gate pre-activations::

        m_t = max(log f_t + m_{t-1}, ĩ_t)                           stabiliser
        c_t = exp(log f_t + m_{t-1} - m_t) c_{t-1} + exp(ĩ_t - m_t) z_t
        n_t = exp(log f_t + m_{t-1} - m_t) n_{t-1} + exp(ĩ_t - m_t)  normaliser
        h_t = σ(õ_t) c_t / n_t,     z_t = tanh(z̃_t),  log f_t = log σ(f̃_t)

    ``h`` depends on ``(c, n, m)`` only through ``ĉ = c / n`` and the log-normaliser
    ``ℓ = m + log n`` (the stabiliser and normaliser together, in log space). This cell carries
    exactly those, which makes the step smooth (``logaddexp`` instead of ``max``) and the block
    3x3 instead of 4x4, with the same ``h`` as xLSTM in exact arithmetic::

        ℓ_t = logaddexp(log f_t + ℓ_{t-1}, ĩ_t)
        λ_t = exp(ĩ_t - ℓ_t)                        share of the new input, in (0, 1]
        ĉ_t = (1 - λ_t) ĉ_{t-1} + λ_t z_t
        h_t = σ(õ_t) ĉ_t

    Gates (``mix="diag"``: one recurrent scalar per channel and gate, ``u = W_x x + b``)::

        z̃ = u_z + r_z h_{t-1}, ĩ = u_i + r_i h_{t-1}, f̃ = u_f + r_f h_{t-1}, õ = u_o + r_o h_{t-1}

    State per channel ``(ĉ, ℓ, h)``: ``[B, d_h, 3]``, output ``h = [..., 2]``. The empty state
    (:meth:`initial_state`, used when no ``h0`` is given) is ``ĉ = h = 0``,
    ``ℓ = EMPTY_LOG_NORMALISER`` (``n_0 = 0``). Structure ``Block(3)``, rows ``(ĉ_t, ℓ_t, h_t)``,
    columns ``(ĉ, ℓ, h)`` of the previous step; with ``g = ∂ℓ_t/∂h = λ r_i + (1-λ)(1-σ(f̃)) r_f``::

        [ 1-λ        -(z-ĉ)λ(1-λ)    (z-ĉ)λ(r_i - g) + λ(1-z²) r_z ]
        [ 0           1-λ             g                            ]
        [ o(1-λ)     -o(z-ĉ)λ(1-λ)   o·(row ĉ, col h) + ĉ_t o(1-o) r_o ]

    Initialisation: ``W_x``, ``b`` as ``nn.Linear``, then the input gate's rows halved and the
    forget-gate bias set to ``-2`` (``f ≈ 0.12``); ``r_* ~ U(-0.25, 0.25)``. The ``(ĉ, ℓ)`` part of
    the block is triangular with diagonal ``1 - λ``, and ``λ`` settles near ``1 - f``; the ``h``
    column is ``O(r)``. So the step contracts strongly at the start. Why this strongly: Newton's
    first residual is dominated by the log-normaliser's memory (``ℓ^0_t = ĩ_t`` against
    ``log Σ_s e^{ĩ_s} Π f``). With xLSTM's long-memory forget bias and full input-gate spread the
    default 3 iterations leave ~1e-3 in float32 at T = 4096; with this init they reach ~1e-7
    (measured, ``tests/core``). Trained weights drift towards longer memory: raise
    ``NewtonConfig.max_iters`` or set ``tol`` then.

    Args:
        d_in: input features.
        d_h: hidden channels.
        mix: recurrent mixing; only ``"diag"`` (per-channel scalars) is supported.
        device, dtype: as for ``torch.nn`` modules.

    Parameters:
        proj: ``ProjectionLinear(d_in, 4 * d_h)`` (an ``nn.Linear``; its ``backend``
            picks the GEMM), gate order ``(z, i, f, o)``.
        recurrent_weight: ``[4, d_h]`` rows ``(r_z, r_i, r_f, r_o)``.
    """

    def __init__(
        self,
        d_in: int,
        d_h: int,
        mix: str = "diag",
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        if mix != "diag":
            raise ValueError(
                f"mix must be 'diag' (per-channel recurrent weights; head-wise block mixing is "
                f"not supported), got {mix!r}"
            )
        super().__init__(d_in=d_in, d_h=d_h, d_u=4 * d_h, structure=Block(3))
        self.mix = mix
        self.proj = ProjectionLinear(d_in, 4 * d_h, device=device, dtype=dtype)
        self.recurrent_weight = nn.Parameter(torch.empty(4, d_h, device=device, dtype=dtype))
        self.reset_recurrent_parameters()

    def reset_recurrent_parameters(self) -> None:
        """Apply the contracting init above (recurrent weights, forget bias, input-gate scale)."""
        d_h = self.d_h
        with torch.no_grad():
            self.recurrent_weight.uniform_(-RECURRENT_INIT, RECURRENT_INIT)
            self.proj.weight[d_h : 2 * d_h].mul_(INPUT_GATE_INIT_SCALE)
            self.proj.bias[d_h : 2 * d_h].mul_(INPUT_GATE_INIT_SCALE)
            self.proj.bias[2 * d_h : 3 * d_h].fill_(FORGET_BIAS_INIT)

    def project(self, x: Tensor) -> Tensor:
        """``[..., d_in] -> [..., 4 d_h]``: the pre-activations ``[u_z, u_i, u_f, u_o]``."""
        out: Tensor = self.proj(x)
        return out

    def initial_state(
        self, batch: int, *, device: torch.device | None = None, dtype: torch.dtype | None = None
    ) -> Tensor:
        """The empty state ``[batch, d_h, 3]``: ``ĉ = h = 0``, ``ℓ = EMPTY_LOG_NORMALISER``."""
        state = torch.zeros(batch, self.d_h, 3, device=device, dtype=dtype)
        state[..., 1] = EMPTY_LOG_NORMALISER
        return state

    def _forward(self, state: Tensor, u: Tensor) -> tuple[Tensor, ...]:
        r_z, r_i, r_f, r_o = self.recurrent_weight
        c, ell, h = state[..., 0], state[..., 1], state[..., 2]
        u_z, u_i, u_f, u_o = torch.split(u, self.d_h, dim=-1)
        z = torch.tanh(u_z + r_z * h)
        i_pre = u_i + r_i * h
        f_pre = u_f + r_f * h
        o = torch.sigmoid(u_o + r_o * h)
        ell_new = torch.logaddexp(F.logsigmoid(f_pre) + ell, i_pre)
        lam = torch.exp(i_pre - ell_new)
        c_new = c + lam * (z - c)
        return c, z, f_pre, o, ell_new, lam, c_new

    def step(self, h_prev: Tensor, u: Tensor) -> Tensor:
        """``(ĉ_t, ℓ_t, h_t)`` from ``h_prev [..., d_h, 3]`` and ``u [..., 4 d_h]``."""
        _c, _z, _f_pre, o, ell_new, _lam, c_new = self._forward(h_prev, u)
        return torch.stack([c_new, ell_new, o * c_new], dim=-1)

    def step_and_jacobian(self, h_prev: Tensor, u: Tensor) -> tuple[Tensor, Tensor]:
        """The new state ``[..., d_h, 3]`` and its 3x3 block Jacobian ``[..., d_h, 3, 3]``."""
        r_z, r_i, r_f, r_o = self.recurrent_weight
        c, z, f_pre, o, ell_new, lam, c_new = self._forward(h_prev, u)
        keep = 1 - lam
        gap = z - c
        g = lam * r_i + keep * torch.sigmoid(-f_pre) * r_f
        dc_dc = keep
        dc_dl = -gap * lam * keep
        dc_dh = gap * lam * (r_i - g) + lam * (1 - z * z) * r_z
        zero = torch.zeros_like(keep)
        dh_dh = o * dc_dh + c_new * o * (1 - o) * r_o
        rows = [
            torch.stack([dc_dc, dc_dl, dc_dh], dim=-1),
            torch.stack([zero, keep, g], dim=-1),
            torch.stack([o * dc_dc, o * dc_dl, dh_dh], dim=-1),
        ]
        return torch.stack([c_new, ell_new, o * c_new], dim=-1), torch.stack(rows, dim=-2)

    def uncoupled_states(self, u: Tensor, h0: Tensor) -> Tensor:
        """The recurrent weights dropped, from ``h0 [B, d_h, 3]``: ``u [B, T, 4 d_h] ->
        [B, T, d_h, 3]``.

        ``ℓ_t = logaddexp(log σ(u_f) + ℓ_{t-1}, u_i)`` in closed form, ``ℓ_t = L_t +
        logcumsumexp(ℓ_0, u_i - L)_t`` with ``L_t = Σ_{s≤t} log σ(u_{f,s})`` (float64: ``L``
        grows like ``T``, and float32 would lose ``ℓ``'s digits to the cancellation); then
        ``λ_t = exp(u_i - ℓ_t)``, ``ĉ_t = (1 - λ_t) ĉ_{t-1} + λ_t tanh(u_z)`` (a linear scan) and
        ``h_t = σ(u_o) ĉ_t``.
        """
        u_z, u_i, u_f, u_o = torch.split(u, self.d_h, dim=-1)
        u_i64 = u_i.double()
        total = torch.cumsum(F.logsigmoid(u_f.double()), dim=1)
        terms = torch.cat([h0[:, None, :, 1].double(), u_i64 - total], dim=1)
        ell = total + torch.logcumsumexp(terms, dim=1)[:, 1:]
        lam = torch.exp(u_i64 - ell).to(u.dtype)
        c = scan_diag(1 - lam, lam * torch.tanh(u_z), h0[..., 0].to(u.dtype))
        states = torch.stack([c, ell.to(u.dtype), torch.sigmoid(u_o) * c], dim=-1)
        return states.to(h0.dtype)
