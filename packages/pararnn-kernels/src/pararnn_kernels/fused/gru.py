"""The fused diagonal-GRU layer: Newton forward, eq. 2.6 backward and the sequential kernel.

The cell is ``pararnn_core.ParaGRU`` (equations in :mod:`pararnn_kernels.fused._kernels`); here it
is given by its tensors: ``u [B, T, 3D]`` (pre-activations ``[u_z, u_r, u_c]``), ``weight [3, D]``
(rows ``a_z, a_r, a_c``) and ``h0 [B, D]``. Storage float32, float16 or bfloat16 (bfloat16 on
compute capability >= 8.0); arithmetic in float32.

* :func:`fused_gru_newton` -- Newton over time chunks that start from the exact state, on-chip,
  to the tolerance per chunk; when ``B·D`` is too small to fill the GPU, also split time into
  segments run from guessed start states, each then corrected on the device from the previous
  segment's end state until the correction dies out (typically one chunk).
  :func:`plan_fused_gru` is the cost model.
* :func:`fused_gru_backward` -- one reverse pass: ``∂L/∂u``, ``∂L/∂h0`` and ``∂L/∂weight``
  (per-program partial sums added in a fixed order: bit-identical on repeat).
* :func:`fused_gru_sequential` -- one step at a time; the honest baseline and the eval path.
* :func:`reference_gru_sequential` -- the same recurrence in pure torch (any dtype and device,
  differentiable by autograd): the oracle of the tests.

The launchers are shared with the block cells (:mod:`._layer`).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from ._layer import (
    FUSED_DEFAULT_TOL,
    HBM_BYTES_PER_S,
    NEWTON_CHUNK_S,
    NEWTON_SM_CHUNK_S,
    SEGMENT_CHUNK_FACTOR,
    SEGMENT_LINK_S,
    SEGMENTS_FIXED_S,
    SEQUENTIAL_STEP_S,
    CellSpec,
    FusedNewtonResult,
    FusedPlan,
    InitialGuess,
    backward,
    check_fused_supported,
    choose_method,
    estimate_seconds,
    newton,
    plan_fused,
    reference_sequential,
    sequential,
)

__all__ = [
    "FUSED_DEFAULT_TOL",
    "HBM_BYTES_PER_S",
    "NEWTON_CHUNK_S",
    "NEWTON_SM_CHUNK_S",
    "SEGMENTS_FIXED_S",
    "SEGMENT_CHUNK_FACTOR",
    "SEGMENT_LINK_S",
    "SEQUENTIAL_STEP_S",
    "FusedNewtonResult",
    "FusedPlan",
    "check_fused_supported",
    "choose_fused_gru_method",
    "estimate_fused_gru_seconds",
    "fused_gru_backward",
    "fused_gru_newton",
    "fused_gru_sequential",
    "plan_fused_gru",
    "reference_gru_sequential",
]


def _gru_step(h: Tensor, u: Tensor, weight: Tensor) -> Tensor:
    channels = h.shape[-1]
    a_z, a_r, a_c = weight
    u_z, u_r, u_c = torch.split(u, channels, dim=-1)
    z = torch.sigmoid(u_z + a_z * h)
    r = torch.sigmoid(u_r + a_r * h)
    c = torch.tanh(u_c + a_c * r * h)
    return h + z * (c - h)


GRU: CellSpec = CellSpec(
    name="GRU",
    gates=("z", "r", "c"),
    components=("h",),
    weights=(("weight", ("a_z", "a_r", "a_c")),),
    kernels="_kernels",
    prefix="gru",
    step=_gru_step,
    empty=(0.0,),
    block_t=128,
    backward_tile=(128, 8, 4),
    backward_narrow=(512, 4, 4),
    newton_work=1.0,
    newton_latency=1.0,
    sequential_work=1.0,
    sequential_bw_share=0.9,
    sequential_rows=(16, 16),
)


def plan_fused_gru(
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
    """The launch shape of :func:`fused_gru_newton`; arguments override the model.

    Tiles: 128 steps x 4 channels, 2 warps (64 x 8 when ``B·D >= 2^15``), the fastest measured.
    Segments: a program walks its chunks one after the other, so when the ``B · ceil(D /
    block_d)`` programs give fewer than four per multiprocessor, time may be split into a
    power-of-two number of segments, up to the largest that gives at most four (more than can
    be resident at once run in turns; each segment at least one chunk). Each segment after the
    first adds a link to the chain (its correcting walk from the previous segment's end state,
    :data:`SEGMENT_LINK_S`), and the split makes chunks slower
    (:data:`SEGMENT_CHUNK_FACTOR`) and adds a fixed cost (:data:`SEGMENTS_FIXED_S`), so the
    count is the one of the fastest cost-model estimate
    (:func:`estimate_fused_gru_seconds`), the fewest on a tie. The block cells
    (:func:`~pararnn_kernels.fused.plan_fused_lstm`,
    :func:`~pararnn_kernels.fused.plan_fused_slstm`) use the same rules with their own default
    ``block_t`` and chunk times.
    """
    return plan_fused(
        GRU,
        batch,
        steps,
        channels,
        device,
        block_t=block_t,
        block_d=block_d,
        segments=segments,
        num_warps=num_warps,
    )


def choose_fused_gru_method(
    batch: int, steps: int, channels: int, device: torch.device, dtype: torch.dtype
) -> Literal["newton", "sequential"]:
    """Fused Newton or the fused sequential kernel for a ``[B, T, D]`` GRU layer: the faster one
    by :func:`estimate_fused_gru_seconds`.

    Both read ``u`` once and write the states once (the byte floor ``4 · B·T·D · size /
    bandwidth``). The sequential kernel pays ``T`` steps of latency (:data:`SEQUENTIAL_STEP_S`)
    per wave of programs, or its share of the bandwidth once ``B·D`` fills the GPU. Newton pays
    per pass the longer of one program's chain of chunks (:data:`NEWTON_CHUNK_S` per 128 steps)
    and the multiprocessors' share of every program's chunks (:data:`NEWTON_SM_CHUNK_S` each),
    plus a fixed cost per call. Measured (fp32, 2026-12-06): Newton is the faster kernel from
    ``(8, 256, 256)`` (1.7x) to ``(8, 16384, 256)`` and at ``(1, 65536, 256)``, the sequential
    kernel at ``(64, 4096, 1024)`` (2.4x); at ``B·D = 8192`` they are within 5 %. The model
    picks each of those (the sequential kernel at ``B·D = 8192``, and at ``(8, 128, 256)``).
    """
    return choose_method(GRU, batch, steps, channels, device, dtype)


def estimate_fused_gru_seconds(
    batch: int, steps: int, channels: int, device: torch.device, dtype: torch.dtype
) -> dict[str, float]:
    """The cost model's forward time of each fused GRU kernel, ``{"newton": s, "sequential": s}``."""
    return estimate_seconds(GRU, batch, steps, channels, device, dtype)


def fused_gru_newton(
    u: Tensor,
    weight: Tensor,
    h0: Tensor | None = None,
    *,
    max_iters: int = 3,
    tol: float | None = None,
    omega: float = 1.0,
    initial_guess: InitialGuess = "step",
    plan: FusedPlan | None = None,
) -> FusedNewtonResult:
    """Solve the diagonal-GRU recurrence by chunked, fused Newton (no autograd graph).

    Args:
        u: ``[B, T, 3D]`` pre-activations ``[u_z, u_r, u_c]`` (CUDA, or CPU under
            ``TRITON_INTERPRET=1``; float32/float16/bfloat16).
        weight: ``[3, D]`` diagonal recurrent weights ``a_z, a_r, a_c``.
        h0: ``[B, D]`` initial state, or None for zeros.
        max_iters: Newton updates per chunk at most (``>= 1``).
        tol: a chunk stops once its max residual ``|f(h_{t-1}, u_t) - h_t|`` is ``<= tol``
            (decided on the device, no host sync); None: :data:`FUSED_DEFAULT_TOL`. With
            segments, a segment's correcting walk also stops at a chunk whose start state moved
            by at most this.
        omega: damping of each update.
        initial_guess: ``"step"``: ``h^0_t = f(0, u_t)``; ``"initial_state"``: zeros;
            ``"uncoupled"``: each chunk's ``h_t = (1 - σ(u_z)) h_{t-1} + σ(u_z) tanh(u_c)``
            (the weights dropped) solved from its exact start state by a scan, which starts
            Newton about one update closer (the start guess of a later segment is
            ``f(0, u)``).
        plan: launch shape; None asks :func:`plan_fused_gru`. Every plan captures in a CUDA
            graph (segments are chained on the device: nothing is read back).

    Returns:
        :class:`FusedNewtonResult` with ``states [B, T, D]`` in ``u``'s dtype.

    Example:
        >>> u = torch.randn(2, 100, 3 * 8, device="cuda")
        >>> res = fused_gru_newton(u, 0.25 * torch.randn(3, 8, device="cuda"))
        >>> res.states.shape
        torch.Size([2, 100, 8])
    """
    return newton(
        GRU,
        u,
        (weight,),
        h0,
        max_iters=max_iters,
        tol=tol,
        omega=omega,
        initial_guess=initial_guess,
        plan=plan,
    )


def fused_gru_backward(
    u: Tensor,
    weight: Tensor,
    h0: Tensor | None,
    states: Tensor,
    grad_states: Tensor,
    *,
    block_t: int | None = None,
    block_d: int | None = None,
    num_warps: int | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Eq. 2.6 backward of the GRU layer in one fused reverse pass (default tiles: 512 x 4 while
    ``B·D <= 2^10``, 128 x 8 otherwise, the fastest measured; 4 warps).

    Args:
        u: ``[B, T, 3D]``; weight ``[3, D]``; h0 ``[B, D]`` or None (zeros);
        states: ``[B, T, D]`` the converged forward states.
        grad_states: ``[B, T, D]`` ``∂L/∂states`` (any strides).

    Returns:
        ``grad_u [B, T, 3D]`` (u's dtype), ``grad_h0 [B, D]`` (u's dtype),
        ``grad_weight [3, D]`` (weight's dtype). Deterministic: no atomics, partial sums over
        the batch added in a fixed order.
    """
    grad_u, grad_h0, (grad_weight,) = backward(
        GRU,
        u,
        (weight,),
        h0,
        states,
        grad_states,
        block_t=block_t,
        block_d=block_d,
        num_warps=num_warps,
    )
    return grad_u, grad_h0, grad_weight


def fused_gru_sequential(
    u: Tensor,
    weight: Tensor,
    h0: Tensor | None = None,
    *,
    block_d: int | None = None,
    rows: int | None = None,
    num_warps: int | None = None,
    vec: int | None = None,
) -> Tensor:
    """The GRU recurrence one step at a time in one kernel: ``u [B, T, 3D]`` -> ``[B, T, D]``.

    ``block_d`` channels per program, ``rows`` steps per loaded and stored tile, ``vec``
    channels per thread; the defaults (64 channels, 16 steps, one warp, 2 channels per thread:
    each thread walks its channels through the tile in registers) are the fastest measured at
    every ``B·D`` (docs/benchmarks.md).
    """
    return sequential(
        GRU, u, (weight,), h0, block_d=block_d, rows=rows, num_warps=num_warps, vec=vec
    )


def reference_gru_sequential(u: Tensor, weight: Tensor, h0: Tensor | None = None) -> Tensor:
    """Pure-torch GRU recurrence (the oracle): ``u [B, T, 3D]``, ``weight [3, D]`` -> ``[B, T, D]``.

    Runs in ``u``'s dtype on any device and is differentiable by autograd.
    """
    return reference_sequential(GRU, u, (weight,), h0)
