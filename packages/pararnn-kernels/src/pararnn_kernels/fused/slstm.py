"""The fused ParaSLSTM(mix="diag") layer: Newton forward, eq. 2.6 backward, sequential kernel.

The cell is ``pararnn_core.ParaSLSTM`` with ``mix="diag"`` in its log-normaliser form (equations
in :mod:`pararnn_kernels.fused._kernels_slstm`), given by its tensors: ``u [B, T, 4D]``
(pre-activations ``[u_z, u_i, u_f, u_o]``), ``recurrent_weight [4, D]`` (rows
``r_z, r_i, r_f, r_o``) and ``h0 [B, D, 3]`` (``[..., 0] = ĉ``, ``[..., 1] = ℓ``,
``[..., 2] = h``). States are ``[B, T, D, 3]`` in the same layout. ``h0=None`` is the *empty*
state ``ĉ = h = 0``, ``ℓ =`` :data:`SLSTM_EMPTY_LOG_NORMALISER` (xLSTM's ``n_0 = 0``), as the
cell's ``initial_state``. Storage float32, float16 or bfloat16; arithmetic in float32. Within a
chunk and across chunks the states stay float32 on-chip; the stored states (``ℓ`` included) are
rounded to the storage dtype, and the backward reads them back.

The functions mirror the GRU's (:mod:`.gru`); the Jacobian is a 3x3 block per channel, so the
on-chip scans run on the pair (3x3 block, 3-vector), twelve tiles.
"""

from __future__ import annotations

from typing import Final, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from ._layer import (
    CellSpec,
    FusedNewtonResult,
    FusedPlan,
    InitialGuess,
    backward,
    choose_method,
    estimate_seconds,
    newton,
    plan_fused,
    reference_sequential,
    sequential,
)

__all__ = [
    "SLSTM_EMPTY_LOG_NORMALISER",
    "choose_fused_slstm_method",
    "estimate_fused_slstm_seconds",
    "fused_slstm_backward",
    "fused_slstm_newton",
    "fused_slstm_sequential",
    "plan_fused_slstm",
    "reference_slstm_sequential",
]

#: ``ℓ`` of the empty state, the value of ``pararnn_core.EMPTY_LOG_NORMALISER``: ``exp(ℓ)``
#: underflows to 0, so the first step gives ``λ = 1`` exactly.
SLSTM_EMPTY_LOG_NORMALISER: Final = -1.0e4


def _slstm_step(state: Tensor, u: Tensor, rows: Tensor) -> Tensor:
    channels = state.shape[-2]
    r_z, r_i, r_f, r_o = rows
    c, ell, h = state[..., 0], state[..., 1], state[..., 2]
    u_z, u_i, u_f, u_o = torch.split(u, channels, dim=-1)
    z = torch.tanh(u_z + r_z * h)
    i_pre = u_i + r_i * h
    f_pre = u_f + r_f * h
    o = torch.sigmoid(u_o + r_o * h)
    ell_new = torch.logaddexp(F.logsigmoid(f_pre) + ell, i_pre)
    lam = torch.exp(i_pre - ell_new)
    c_new = c + lam * (z - c)
    return torch.stack([c_new, ell_new, o * c_new], dim=-1)


#: Cost factors against the GRU, fitted to the H200 times of these kernels (a Newton step scans
#: twelve tiles under a 3x3 matrix product, 39 multiply-adds against the GRU's 3, besides about
#: seven transcendentals; a sequential step's dependency chain holds about five transcendentals,
#: log-sigmoid, logaddexp and exp, against the GRU's two, and with tiles of 8 steps per thread
#: measured 0.31 us per step against the GRU's 0.16; with 4 steps, 55 % of the copy bandwidth at
#: B = 64, T = 4096, d = 1024, where 8 reached only 43 %).
SLSTM: CellSpec = CellSpec(
    name="sLSTM",
    gates=("z", "i", "f", "o"),
    components=("c", "l", "h"),
    weights=(("recurrent_weight", ("r_z", "r_i", "r_f", "r_o")),),
    kernels="_kernels_slstm",
    prefix="slstm",
    step=_slstm_step,
    empty=(0.0, SLSTM_EMPTY_LOG_NORMALISER, 0.0),
    block_t=64,
    wide_block_t=32,
    backward_tile=(16, 8, 4),
    newton_work=4.2,
    newton_latency=2.9,
    sequential_work=1.5,
    sequential_bw_share=0.55,
    sequential_rows=(8, 4),
)


def plan_fused_slstm(
    batch: int,
    steps: int,
    channels: int,
    device: torch.device,
    *,
    block_t: int | None = None,
    block_d: int | None = None,
    segments: int | None = None,
    num_warps: int | None = None,
) -> FusedPlan:
    """The launch shape of :func:`fused_slstm_newton`; arguments override the model.

    The model of :func:`~pararnn_kernels.fused.plan_fused_gru`, with chunks of 64 steps by
    default (two steps per thread in the twelve-tile scan; 32-step chunks spread one step per
    thread and ran 1.25x slower at ``B = 8, d = 256``, docs/benchmarks.md, 2026-12-06), and 32
    once ``B·D`` reaches ``2^15``.
    """
    return plan_fused(
        SLSTM,
        batch,
        steps,
        channels,
        device,
        block_t=block_t,
        block_d=block_d,
        segments=segments,
        num_warps=num_warps,
    )


def choose_fused_slstm_method(
    batch: int, steps: int, channels: int, device: torch.device, dtype: torch.dtype
) -> Literal["newton", "sequential"]:
    """Fused Newton or the fused sequential kernel for a ``[B, T, D]`` sLSTM layer.

    The GRU's model (:func:`~pararnn_kernels.fused.choose_fused_gru_method`) with the sLSTM's
    factors: byte floor ``(4 + 3) · B·T·D · size / bandwidth``, the sequential step at 1.5
    times the GRU's, a Newton chunk's latency at 2.9 and its multiprocessor time at 4.2 times
    the GRU's (``SLSTM.sequential_work``, ``SLSTM.newton_latency``, ``SLSTM.newton_work``:
    fitted to the fused kernels' times of 2026-12-06), 55 % of the copy bandwidth for the
    sequential kernel when ``B·D`` fills the GPU (fitted on an H200; docs/benchmarks.md has
    both).
    """
    return choose_method(SLSTM, batch, steps, channels, device, dtype)


def estimate_fused_slstm_seconds(
    batch: int, steps: int, channels: int, device: torch.device, dtype: torch.dtype
) -> dict[str, float]:
    """The cost model's forward times of the fused sLSTM kernels: ``{"newton": s,
    "sequential": s}`` (:func:`choose_fused_slstm_method` picks the smaller)."""
    return estimate_seconds(SLSTM, batch, steps, channels, device, dtype)


def fused_slstm_newton(
    u: Tensor,
    recurrent_weight: Tensor,
    h0: Tensor | None = None,
    *,
    max_iters: int = 3,
    tol: float | None = None,
    omega: float = 1.0,
    initial_guess: InitialGuess = "step",
    plan: FusedPlan | None = None,
) -> FusedNewtonResult:
    """Solve the ParaSLSTM(mix="diag") recurrence by chunked, fused Newton (no autograd graph).

    Args:
        u: ``[B, T, 4D]`` pre-activations ``[u_z, u_i, u_f, u_o]`` (CUDA, or CPU under
            ``TRITON_INTERPRET=1``; float32/float16/bfloat16).
        recurrent_weight: ``[4, D]`` rows ``r_z, r_i, r_f, r_o``.
        h0: ``[B, D, 3]`` initial ``(ĉ, ℓ, h)``, or None for the empty state.
        max_iters: Newton updates per chunk at most (``>= 1``).
        tol: a chunk stops once its max residual (over ``ĉ``, ``ℓ`` and ``h``) is ``<= tol``;
            None: :data:`~pararnn_kernels.fused.FUSED_DEFAULT_TOL`. With segments, a segment's
            correcting walk also stops at a chunk whose start state moved by at most this.
        omega: damping of each update.
        initial_guess: ``"step"``: one step from the empty state, ``s^0_t = f(s_∅, u_t)``;
            ``"initial_state"``: the empty state ``s_∅``; ``"uncoupled"``: each chunk's states
            with the recurrent weights dropped (``ℓ_t = logaddexp(log σ(u_f) + ℓ_{t-1}, u_i)``,
            then ``ĉ`` and ``h = σ(u_o) ĉ``) solved from its exact start state by two scans,
            which starts Newton about one update closer (mostly the log-normaliser's memory,
            the slowest part of a guess to settle).
        plan: launch shape; None asks :func:`plan_fused_slstm`. Every plan captures in a CUDA
            graph (segments are chained on the device: nothing is read back).

    Returns:
        :class:`~pararnn_kernels.fused.FusedNewtonResult` with ``states [B, T, D, 3]`` in
        ``u``'s dtype.

    Example:
        >>> u = torch.randn(2, 100, 4 * 8, device="cuda")
        >>> fused_slstm_newton(u, 0.25 * torch.randn(4, 8, device="cuda")).states.shape
        torch.Size([2, 100, 8, 3])
    """
    return newton(
        SLSTM,
        u,
        (recurrent_weight,),
        h0,
        max_iters=max_iters,
        tol=tol,
        omega=omega,
        initial_guess=initial_guess,
        plan=plan,
    )


def fused_slstm_backward(
    u: Tensor,
    recurrent_weight: Tensor,
    h0: Tensor | None,
    states: Tensor,
    grad_states: Tensor,
    *,
    block_t: int | None = None,
    block_d: int | None = None,
    num_warps: int | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Eq. 2.6 backward of the ParaSLSTM(mix="diag") layer in one fused reverse pass.

    Args:
        u: ``[B, T, 4D]``; recurrent_weight ``[4, D]``; h0 ``[B, D, 3]`` or None (empty state);
        states: ``[B, T, D, 3]`` the converged forward states.
        grad_states: ``[B, T, D, 3]`` ``∂L/∂states`` (any strides).
        block_t, block_d, num_warps: steps per chunk, channels per program and warps
            (None: 16 x 8 on 4 warps; 128 x 2 on 2 warps while ``B·D <= 2^10``).

    Returns:
        ``grad_u [B, T, 4D]`` (u's dtype), ``grad_h0 [B, D, 3]`` (u's dtype),
        ``grad_recurrent_weight [4, D]`` (its dtype). Deterministic: no atomics, partial sums
        added in a fixed order.
    """
    grad_u, grad_h0, (grad_w,) = backward(
        SLSTM,
        u,
        (recurrent_weight,),
        h0,
        states,
        grad_states,
        block_t=block_t,
        block_d=block_d,
        num_warps=num_warps,
    )
    return grad_u, grad_h0, grad_w


def fused_slstm_sequential(
    u: Tensor,
    recurrent_weight: Tensor,
    h0: Tensor | None = None,
    *,
    block_d: int | None = None,
    rows: int | None = None,
    num_warps: int | None = None,
    vec: int | None = None,
) -> Tensor:
    """The ParaSLSTM recurrence one step at a time in one kernel: ``u [B, T, 4D]`` ->
    ``[B, T, D, 3]``; the plan arguments as in
    :func:`~pararnn_kernels.fused.fused_gru_sequential`. Default plan: 64 channels, one warp,
    2 channels per thread, 8 steps per tile while ``B·D < 2^15`` and 4 from there, the fastest
    measured for this kernel (docs/benchmarks.md)."""
    return sequential(
        SLSTM,
        u,
        (recurrent_weight,),
        h0,
        block_d=block_d,
        rows=rows,
        num_warps=num_warps,
        vec=vec,
    )


def reference_slstm_sequential(
    u: Tensor, recurrent_weight: Tensor, h0: Tensor | None = None
) -> Tensor:
    """Pure-torch ParaSLSTM recurrence (the oracle): ``u [B, T, 4D]`` -> ``[B, T, D, 3]``.

    Runs in ``u``'s dtype on any device and is differentiable by autograd; ``h0=None`` is the
    empty state.
    """
    return reference_sequential(SLSTM, u, (recurrent_weight,), h0)
