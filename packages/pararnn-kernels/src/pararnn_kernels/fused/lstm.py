"""The fused ParaLSTM layer: Newton forward, eq. 2.6 backward and the sequential kernel.

The cell is ``pararnn_core.ParaLSTM`` (equations in :mod:`pararnn_kernels.fused._kernels_lstm`),
given by its tensors: ``u [B, T, 3D]`` (pre-activations ``[u_f, u_z, u_o]``),
``recurrent_weight [3, D]`` (rows ``a_f, a_z, a_o``), ``peephole_weight [2, D]`` (rows
``p_f, p_o``) and ``h0 [B, D, 2]`` (``[..., 0] = c``, ``[..., 1] = h``). States are
``[B, T, D, 2]`` in the same layout. Storage float32, float16 or bfloat16 (bfloat16 on compute
capability >= 8.0); arithmetic in float32.

The functions mirror the GRU's (:mod:`.gru`: same arguments, plans, stats and time segments);
the Jacobian is a 2x2 block per channel, so the on-chip scans run on the pair (2x2 block,
2-vector).
"""

from __future__ import annotations

from typing import Literal

import torch
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
    "choose_fused_lstm_method",
    "estimate_fused_lstm_seconds",
    "fused_lstm_backward",
    "fused_lstm_newton",
    "fused_lstm_sequential",
    "plan_fused_lstm",
    "reference_lstm_sequential",
]


def _lstm_step(state: Tensor, u: Tensor, rows: Tensor) -> Tensor:
    channels = state.shape[-2]
    a_f, a_z, a_o, p_f, p_o = rows
    c, h = state[..., 0], state[..., 1]
    u_f, u_z, u_o = torch.split(u, channels, dim=-1)
    f = torch.sigmoid(u_f + a_f * h + p_f * c)
    z = torch.tanh(u_z + a_z * h)
    c_new = z + f * (c - z)
    o = torch.sigmoid(u_o + a_o * h + p_o * c_new)
    return torch.stack([c_new, o * torch.tanh(c_new)], dim=-1)


#: Cost factors against the GRU, fitted to the H200 times of these kernels (a Newton step scans
#: six tiles under a 2x2 matrix product, 18 multiply-adds against the GRU's 3, besides four
#: transcendentals; a sequential step's dependency chain holds three transcendentals against the
#: GRU's two, and with tiles of 8 steps per thread measured 0.213 us per step against the GRU's
#: 0.16, and 71.5 % of the copy bandwidth at B = 64, T = 4096, d = 1024).
LSTM: CellSpec = CellSpec(
    name="LSTM",
    gates=("f", "z", "o"),
    components=("c", "h"),
    weights=(("recurrent_weight", ("a_f", "a_z", "a_o")), ("peephole_weight", ("p_f", "p_o"))),
    kernels="_kernels_lstm",
    prefix="lstm",
    step=_lstm_step,
    empty=(0.0, 0.0),
    block_t=128,
    backward_tile=(32, 8, 4),
    newton_work=2.43,
    newton_latency=1.37,
    sequential_work=1.45,
    sequential_bw_share=0.7,
    sequential_rows=(8, 8),
    num_warps=4,
)


def plan_fused_lstm(
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
    """The launch shape of :func:`fused_lstm_newton`; arguments override the model.

    The model of :func:`~pararnn_kernels.fused.plan_fused_gru`, with chunks of 128 steps on 4
    warps by default (64 steps on 2 warps once ``B·D`` reaches ``2^15``): the fastest tile
    measured at ``B = 8, d = 256`` (docs/benchmarks.md, 2026-12-06).
    """
    return plan_fused(
        LSTM,
        batch,
        steps,
        channels,
        device,
        block_t=block_t,
        block_d=block_d,
        segments=segments,
        num_warps=num_warps,
    )


def choose_fused_lstm_method(
    batch: int, steps: int, channels: int, device: torch.device, dtype: torch.dtype
) -> Literal["newton", "sequential"]:
    """Fused Newton or the fused sequential kernel for a ``[B, T, D]`` LSTM layer.

    The GRU's model (:func:`~pararnn_kernels.fused.choose_fused_gru_method`) with the LSTM's
    factors: byte floor ``(3 + 2) · B·T·D · size / bandwidth`` (three gates read, two state
    components written), the sequential step at 1.45 times the GRU's, a Newton chunk's latency
    at 1.37 and its multiprocessor time at 2.43 times the GRU's (``LSTM.sequential_work``,
    ``LSTM.newton_latency``, ``LSTM.newton_work``: fitted to the fused kernels' times of
    2026-12-06), 70 % of the copy bandwidth for the sequential kernel when ``B·D`` fills the GPU
    (fitted on an H200; docs/benchmarks.md has both).
    """
    return choose_method(LSTM, batch, steps, channels, device, dtype)


def estimate_fused_lstm_seconds(
    batch: int, steps: int, channels: int, device: torch.device, dtype: torch.dtype
) -> dict[str, float]:
    """The cost model's forward times of the fused LSTM kernels: ``{"newton": s,
    "sequential": s}`` (:func:`choose_fused_lstm_method` picks the smaller)."""
    return estimate_seconds(LSTM, batch, steps, channels, device, dtype)


def fused_lstm_newton(
    u: Tensor,
    recurrent_weight: Tensor,
    peephole_weight: Tensor,
    h0: Tensor | None = None,
    *,
    max_iters: int = 3,
    tol: float | None = None,
    omega: float = 1.0,
    initial_guess: InitialGuess = "step",
    plan: FusedPlan | None = None,
) -> FusedNewtonResult:
    """Solve the ParaLSTM recurrence by chunked, fused Newton (no autograd graph).

    Args:
        u: ``[B, T, 3D]`` pre-activations ``[u_f, u_z, u_o]`` (CUDA, or CPU under
            ``TRITON_INTERPRET=1``; float32/float16/bfloat16).
        recurrent_weight: ``[3, D]`` rows ``a_f, a_z, a_o``.
        peephole_weight: ``[2, D]`` rows ``p_f, p_o``.
        h0: ``[B, D, 2]`` initial ``(c, h)``, or None for zeros.
        max_iters: Newton updates per chunk at most (``>= 1``).
        tol: a chunk stops once its max residual (over ``c`` and ``h``) is ``<= tol``; None:
            :data:`~pararnn_kernels.fused.FUSED_DEFAULT_TOL`. With segments, a segment's
            correcting walk also stops at a chunk whose start state moved by at most this.
        omega: damping of each update.
        initial_guess: ``"step"``: ``s^0_t = f(0, u_t)``; ``"initial_state"``: zeros;
            ``"uncoupled"``: each chunk's states with the couplings to ``h`` and the forget
            peephole dropped (``c_t = σ(u_f) c_{t-1} + (1 - σ(u_f)) tanh(u_z)``,
            ``h_t = σ(u_o + p_o c_t) tanh(c_t)``) solved from its exact start state by a scan,
            which starts Newton about one update closer.
        plan: launch shape; None asks :func:`plan_fused_lstm`. Every plan captures in a CUDA
            graph (segments are chained on the device: nothing is read back).

    Returns:
        :class:`~pararnn_kernels.fused.FusedNewtonResult` with ``states [B, T, D, 2]`` in
        ``u``'s dtype.

    Example:
        >>> u = torch.randn(2, 100, 3 * 8, device="cuda")
        >>> w, p = 0.25 * torch.randn(3, 8, device="cuda"), 0.25 * torch.randn(2, 8, device="cuda")
        >>> fused_lstm_newton(u, w, p).states.shape
        torch.Size([2, 100, 8, 2])
    """
    return newton(
        LSTM,
        u,
        (recurrent_weight, peephole_weight),
        h0,
        max_iters=max_iters,
        tol=tol,
        omega=omega,
        initial_guess=initial_guess,
        plan=plan,
    )


def fused_lstm_backward(
    u: Tensor,
    recurrent_weight: Tensor,
    peephole_weight: Tensor,
    h0: Tensor | None,
    states: Tensor,
    grad_states: Tensor,
    *,
    block_t: int | None = None,
    block_d: int | None = None,
    num_warps: int | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Eq. 2.6 backward of the ParaLSTM layer in one fused reverse pass.

    Args:
        u: ``[B, T, 3D]``; recurrent_weight ``[3, D]``; peephole_weight ``[2, D]``;
        h0: ``[B, D, 2]`` or None (zeros);
        states: ``[B, T, D, 2]`` the converged forward states.
        grad_states: ``[B, T, D, 2]`` ``∂L/∂states`` (any strides).
        block_t, block_d, num_warps: steps per chunk, channels per program and warps
            (None: 32 x 8 on 4 warps; 128 x 2 on 2 warps while ``B·D <= 2^10``).

    Returns:
        ``grad_u [B, T, 3D]`` (u's dtype), ``grad_h0 [B, D, 2]`` (u's dtype),
        ``grad_recurrent_weight [3, D]`` and ``grad_peephole_weight [2, D]`` (their dtypes).
        Deterministic: no atomics, partial sums added in a fixed order.
    """
    grad_u, grad_h0, (grad_w, grad_p) = backward(
        LSTM,
        u,
        (recurrent_weight, peephole_weight),
        h0,
        states,
        grad_states,
        block_t=block_t,
        block_d=block_d,
        num_warps=num_warps,
    )
    return grad_u, grad_h0, grad_w, grad_p


def fused_lstm_sequential(
    u: Tensor,
    recurrent_weight: Tensor,
    peephole_weight: Tensor,
    h0: Tensor | None = None,
    *,
    block_d: int | None = None,
    rows: int | None = None,
    num_warps: int | None = None,
    vec: int | None = None,
) -> Tensor:
    """The ParaLSTM recurrence one step at a time in one kernel: ``u [B, T, 3D]`` ->
    ``[B, T, D, 2]``; the plan arguments as in
    :func:`~pararnn_kernels.fused.fused_gru_sequential`. Default plan: 64 channels, 8 steps
    per tile, one warp, 2 channels per thread, the fastest measured for this kernel
    (docs/benchmarks.md)."""
    return sequential(
        LSTM,
        u,
        (recurrent_weight, peephole_weight),
        h0,
        block_d=block_d,
        rows=rows,
        num_warps=num_warps,
        vec=vec,
    )


def reference_lstm_sequential(
    u: Tensor, recurrent_weight: Tensor, peephole_weight: Tensor, h0: Tensor | None = None
) -> Tensor:
    """Pure-torch ParaLSTM recurrence (the oracle): ``u [B, T, 3D]`` -> ``[B, T, D, 2]``.

    Runs in ``u``'s dtype on any device and is differentiable by autograd.
    """
    return reference_sequential(LSTM, u, (recurrent_weight, peephole_weight), h0)
