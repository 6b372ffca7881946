"""The fused diagonal-GRU layer: Newton forward, eq. 2.6 backward and the sequential kernel.

The cell is ``pararnn_core.ParaGRU`` (equations in :mod:`pararnn_kernels.fused._kernels`); here it
is given by its tensors: ``u [B, T, 3D]`` (pre-activations ``[u_z, u_r, u_c]``), ``weight [3, D]``
(rows ``a_z, a_r, a_c``) and ``h0 [B, D]``. Storage float32, float16 or bfloat16 (bfloat16 on
compute capability >= 8.0); arithmetic in float32.

* :func:`fused_gru_newton` -- Newton over time chunks that start from the exact state, on-chip,
  to the tolerance per chunk; when ``B·D`` is too small to fill the GPU, also split time into
  segments run from guessed start states and corrected by Newton on the segment boundaries
  (each correction pass reads the inputs once more). :func:`plan_fused_gru` is the cost model.
* :func:`fused_gru_backward` -- one reverse pass: ``∂L/∂u``, ``∂L/∂h0`` and ``∂L/∂weight``
  (per-program partial sums added in a fixed order: bit-identical on repeat).
* :func:`fused_gru_sequential` -- one step at a time; the honest baseline and the eval path.
* :func:`reference_gru_sequential` -- the same recurrence in pure torch (any dtype and device,
  differentiable by autograd): the oracle of the tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final, Literal

import torch
from torch import Tensor

from ..dispatch import (
    TRITON_STORAGE_DTYPES,
    multiprocessor_count,
    supports_bf16,
    triton_installed,
    triton_interpret_mode,
)
from ..scan import scan_diag

__all__ = [
    "FUSED_DEFAULT_TOL",
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

#: The per-chunk stopping tolerance when none is given: float32 arithmetic resolves residuals of
#: states in ``[-1, 1]`` to about this, so a tighter one only spends iterations.
FUSED_DEFAULT_TOL: Final = 1.0e-6
#: Boundary-correction passes at most when time is split into segments.
MAX_SEGMENT_PASSES: Final = 4


@dataclass(frozen=True)
class FusedPlan:
    """Launch shape of :func:`fused_gru_newton`.

    Attributes:
        block_t: steps per chunk (a power of two).
        block_d: channels per program (a power of two).
        segments: time segments (1: every chunk starts from the exact state; more: segments
            start from guesses corrected on the boundaries).
        num_warps: warps per program.
    """

    block_t: int = 128
    block_d: int = 16
    segments: int = 1
    num_warps: int = 4


@dataclass(frozen=True)
class FusedNewtonResult:
    """What :func:`fused_gru_newton` returns.

    Attributes:
        states: ``[B, T, D]``, the storage dtype of ``u``.
        iters: the most Newton updates any chunk ran (over all passes).
        residuals: per update index k, the max over chunks (and passes) of the residual
            before update k (chunks that had stopped do not count); ``iters + 1`` entries;
            ``inf`` marks a non-finite residual.
        max_residual: the largest residual any chunk stopped at, and the largest mismatch between
            a segment's end state and the next segment's start state.
        passes: full passes over the inputs (1 without segments).
        plan: the launch shape used.
    """

    states: Tensor
    iters: int
    residuals: tuple[float, ...]
    max_residual: float
    passes: int
    plan: FusedPlan


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def check_fused_supported(tensor: Tensor, name: str = "u") -> None:
    """Raise unless the fused kernels can run on ``tensor``'s device and dtype.

    Raises:
        ValueError: not a CUDA tensor (and not under ``TRITON_INTERPRET=1``), a dtype other than
            float32/float16/bfloat16, bfloat16 below compute capability 8.0, or no Triton.
    """
    if not triton_installed():
        raise ValueError("the fused kernels need the 'triton' package, which is not installed")
    if tensor.device.type != "cuda" and not triton_interpret_mode():
        raise ValueError(
            f"the fused kernels need CUDA tensors, got {name} on {tensor.device}; set "
            "TRITON_INTERPRET=1 before importing pararnn_kernels to run them in the interpreter"
        )
    if tensor.dtype not in TRITON_STORAGE_DTYPES:
        raise ValueError(
            f"the fused kernels store float32, float16 or bfloat16; got {name} of {tensor.dtype}"
        )
    if tensor.dtype == torch.bfloat16 and not supports_bf16(tensor.device):
        raise ValueError(
            f"bfloat16 storage needs compute capability >= 8.0; {tensor.device} has "
            f"{torch.cuda.get_device_capability(tensor.device)}"
        )


def _check_layer(u: Tensor, weight: Tensor, h0: Tensor | None) -> tuple[int, int, int]:
    if not isinstance(u, Tensor) or u.dim() != 3:
        raise ValueError(f"u must be [B, T, 3D], got shape {tuple(getattr(u, 'shape', ()))}")
    batch, steps, width = u.shape
    if width % 3 != 0:
        raise ValueError(f"u's last axis must be 3D (gates z, r, c), got {width}")
    channels = width // 3
    if steps < 1:
        raise ValueError(f"u must have T >= 1 steps, got T={steps}")
    if tuple(weight.shape) != (3, channels):
        raise ValueError(f"weight must be [3, D] = [3, {channels}], got {tuple(weight.shape)}")
    if weight.device != u.device:
        raise ValueError(f"weight is on {weight.device}, u on {u.device}")
    if h0 is not None:
        if tuple(h0.shape) != (batch, channels):
            raise ValueError(f"h0 must be [B, D] = [{batch}, {channels}], got {tuple(h0.shape)}")
        if h0.device != u.device:
            raise ValueError(f"h0 is on {h0.device}, u on {u.device}")
    check_fused_supported(u)
    return batch, steps, channels


def _kernels() -> Any:
    from . import _kernels

    return _kernels


# Cost-model constants, measured on an H200 in float32 with benchmarks/bench_fused.py
# (docs/benchmarks.md has the sweep): a Newton chunk of 128 steps takes about NEWTON_CHUNK_S per
# wave of resident programs, plus NEWTON_FIXED_S per call (launch, the stats read-back); the
# sequential kernel takes SEQUENTIAL_STEP_S per step per wave and reaches SEQUENTIAL_BW_SHARE of
# the copy bandwidth when B·D fills the GPU.
NEWTON_CHUNK_S: Final = 7.0e-6
NEWTON_FIXED_S: Final = 0.35e-3
SEQUENTIAL_STEP_S: Final = 0.25e-6
SEQUENTIAL_BW_SHARE: Final = 0.43
#: The copy bandwidth of an H200 (bytes read plus written per second), for the byte floor.
HBM_BYTES_PER_S: Final = 4.3e12
_RESIDENT_PER_SM: Final = 4
_SEQUENTIAL_PER_SM: Final = 8
# Above this many channels in total (B·D) the kernels are throughput-bound: larger tiles.
_WIDE: Final = 2**15


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
    block_d)`` programs give fewer than two per multiprocessor, time is split into the
    smallest power-of-two number of segments that does (each segment at least one chunk). A
    segmented solve costs a second, warm-started pass, which only pays off there.
    """
    wide = batch * channels >= _WIDE
    block_t = block_t or (64 if wide else 128)
    block_d = block_d or min(8 if wide else 4, _next_power_of_2(channels))
    if segments is None:
        programs = batch * math.ceil(channels / block_d)
        target = 2 * multiprocessor_count(device)
        chunks = math.ceil(steps / block_t)
        segments = 1
        while programs * segments < target and 2 * segments <= chunks:
            segments *= 2
    if segments < 1:
        raise ValueError(f"segments must be >= 1, got {segments}")
    return FusedPlan(block_t, block_d, segments, num_warps or 2)


def _byte_floor_s(batch: int, steps: int, channels: int, dtype: torch.dtype) -> float:
    size = torch.empty((), dtype=dtype).element_size()
    return 4 * batch * steps * channels * size / HBM_BYTES_PER_S


def estimate_fused_gru_seconds(
    batch: int, steps: int, channels: int, device: torch.device, dtype: torch.dtype
) -> dict[str, float]:
    """The cost model's forward time of each fused kernel, ``{"newton": s, "sequential": s}``."""
    floor = _byte_floor_s(batch, steps, channels, dtype)
    sms = multiprocessor_count(device)
    seq_block_d = _sequential_plan(batch, channels)[0]
    seq_waves = math.ceil(batch * math.ceil(channels / seq_block_d) / (_SEQUENTIAL_PER_SM * sms))
    sequential = max(floor / SEQUENTIAL_BW_SHARE, steps * SEQUENTIAL_STEP_S * seq_waves)
    plan = plan_fused_gru(batch, steps, channels, device)
    programs = batch * math.ceil(channels / plan.block_d) * plan.segments
    waves = math.ceil(programs / (_RESIDENT_PER_SM * sms))
    chunks = math.ceil(steps / (plan.segments * plan.block_t))
    passes = 1 if plan.segments == 1 else 2
    chunk_s = NEWTON_CHUNK_S * plan.block_t / 128
    newton = NEWTON_FIXED_S + max(floor * passes, passes * waves * chunks * chunk_s)
    return {"newton": newton, "sequential": sequential}


def choose_fused_gru_method(
    batch: int, steps: int, channels: int, device: torch.device, dtype: torch.dtype
) -> Literal["newton", "sequential"]:
    """Fused Newton or the fused sequential kernel for a ``[B, T, D]`` GRU layer: the faster one
    by :func:`estimate_fused_gru_seconds`.

    Both read ``u`` once and write the states once (the byte floor ``4 · B·T·D · size /
    bandwidth``). The sequential kernel pays ``T`` steps of latency per wave of programs, or
    its share of the bandwidth once ``B·D`` fills the GPU; Newton pays its chunk time per wave
    plus a fixed cost per call. Measured picks (H200, fp32): sequential at ``(8, 1024, 256)`` and
    ``(64, 4096, 1024)``, Newton at ``(8, 4096, 256)``, ``(8, 16384, 256)``, ``(1, 65536, 256)``.
    """
    estimate = estimate_fused_gru_seconds(batch, steps, channels, device, dtype)
    return "newton" if estimate["newton"] <= estimate["sequential"] else "sequential"


def _sequential_plan(batch: int, channels: int) -> tuple[int, int, int]:
    """(block_d, rows, num_warps) of the sequential kernel, the fastest measured: 16 channels and
    4 steps per tile while B·D is small (latency-bound), 64 channels one step at a time when
    B·D fills the GPU (bandwidth-bound)."""
    if batch * channels >= _WIDE:
        return min(64, _next_power_of_2(channels)), 1, 2
    return min(16, _next_power_of_2(channels)), 4, 1


def _segment_guess(u: Tensor, starts_t: Tensor, channels: int, step_guess: bool) -> Tensor:
    """Start states of segments 1.. from the initial guess at the step before each start."""
    if not step_guess:
        return torch.zeros(
            starts_t.numel(), u.shape[0], channels, device=u.device, dtype=torch.float32
        )
    before = u[:, starts_t - 1].float()  # [B, S-1, 3D]
    u_z, _u_r, u_c = torch.split(before, channels, dim=-1)
    return (torch.sigmoid(u_z) * torch.tanh(u_c)).transpose(0, 1)


def fused_gru_newton(
    u: Tensor,
    weight: Tensor,
    h0: Tensor | None = None,
    *,
    max_iters: int = 3,
    tol: float | None = None,
    omega: float = 1.0,
    initial_guess: Literal["step", "initial_state"] = "step",
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
            segments, the boundary correction also stops at this mismatch (one host sync per
            pass).
        omega: damping of each update.
        initial_guess: ``"step"``: ``h^0_t = f(0, u_t)``; ``"initial_state"``: zeros.
        plan: launch shape; None asks :func:`plan_fused_gru`.

    Returns:
        :class:`FusedNewtonResult` with ``states [B, T, D]`` in ``u``'s dtype.

    Example:
        >>> u = torch.randn(2, 100, 3 * 8, device="cuda")
        >>> res = fused_gru_newton(u, 0.25 * torch.randn(3, 8, device="cuda"))
        >>> res.states.shape
        torch.Size([2, 100, 8])
    """
    batch, steps, channels = _check_layer(u, weight, h0)
    if not isinstance(max_iters, int) or max_iters < 1:
        raise ValueError(f"max_iters must be an int >= 1, got {max_iters!r}")
    tol = FUSED_DEFAULT_TOL if tol is None else float(tol)
    plan = plan or plan_fused_gru(batch, steps, channels, u.device)
    u = u.contiguous()
    weight = weight.detach().contiguous()
    dev = u.device
    n_d = math.ceil(channels / plan.block_d)
    segments = min(plan.segments, math.ceil(steps / plan.block_t))
    seg_len = math.ceil(math.ceil(steps / segments) / plan.block_t) * plan.block_t
    segments = math.ceil(steps / seg_len)
    hist_len = _next_power_of_2(max_iters + 2)

    starts = torch.empty(segments, batch, channels, device=dev, dtype=torch.float32)
    starts[0] = 0.0 if h0 is None else h0.float()
    if segments > 1:
        seg_t = torch.arange(1, segments, device=dev) * seg_len
        starts[1:] = _segment_guess(u, seg_t, channels, initial_guess == "step")
    out = torch.empty(batch, steps, channels, device=dev, dtype=u.dtype)
    ends = torch.empty_like(starts)
    jprod = torch.empty_like(starts)
    kernel = torch.library.wrap_triton(_kernels().gru_newton_kernel)
    hists: list[Tensor] = []
    all_iters: list[Tensor] = []

    def run_pass(first: int, guess: int) -> None:
        ran = segments - first
        hist = torch.empty(ran * batch * n_d, hist_len, device=dev, dtype=torch.float32)
        iters = torch.empty(ran * batch * n_d, device=dev, dtype=torch.int32)
        kernel[(n_d, batch, ran)](
            u,
            weight,
            starts,
            out,
            ends,
            jprod,
            hist,
            iters,
            steps,
            channels,
            seg_len,
            first,
            tol,
            float(omega),
            MAX_ITERS=max_iters,
            GUESS=guess,
            NEED_JPROD=segments > 1,
            HIST=hist_len,
            BLOCK_T=plan.block_t,
            BLOCK_D=plan.block_d,
            num_warps=plan.num_warps,
        )
        hists.append(hist)
        all_iters.append(iters)

    run_pass(0, 1 if initial_guess == "step" else 0)
    passes = 1
    mismatch = torch.zeros((), device=dev)
    while segments > 1:
        # Each segment's end state should be the next one's start state, and jprod is the
        # derivative of a segment's end by its start: one Newton step on the boundaries is the
        # linear recurrence s'_{j+1} = jprod_j s'_j + (end_j - jprod_j s_j), s'_0 = h0, a scan
        # over the segments. The correction pass then warm-starts from the states it has.
        mult = jprod[:-1].transpose(0, 1).contiguous()
        offset = (ends[:-1] - jprod[:-1] * starts[:-1]).transpose(0, 1).contiguous()
        fixed = scan_diag(mult, offset, starts[0], backend="auto")
        starts = torch.cat([starts[:1], fixed.transpose(0, 1)]).contiguous()
        run_pass(1, 2)
        passes += 1
        mismatch = (ends[:-1] - starts[1:]).abs().amax()
        # One host sync per correction pass (the first correction needs none before it).
        gap = float(mismatch)
        if not math.isfinite(gap) or gap <= tol or passes >= MAX_SEGMENT_PASSES:
            break

    # Everything the stats need, read back in one sync.
    hist_all = torch.cat(hists)
    per_iter = hist_all[:, : max_iters + 1].amax(dim=0)
    summary = torch.cat(
        [
            per_iter,
            hist_all[:, -1].amax().unsqueeze(0),
            mismatch.float().unsqueeze(0),
            torch.cat(all_iters).amax().float().unsqueeze(0),
        ]
    ).tolist()
    most = int(summary[-1])
    residuals = tuple(float(v) for v in summary[: most + 1])
    worst = max(summary[max_iters + 1], summary[max_iters + 2])
    if any(not math.isfinite(v) for v in (*residuals, worst)):
        worst = math.inf
    return FusedNewtonResult(out, most, residuals, worst, passes, plan)


def fused_gru_backward(
    u: Tensor,
    weight: Tensor,
    h0: Tensor | None,
    states: Tensor,
    grad_states: Tensor,
    *,
    block_t: int | None = None,
    block_d: int | None = None,
    num_warps: int = 4,
) -> tuple[Tensor, Tensor, Tensor]:
    """Eq. 2.6 backward of the GRU layer in one fused reverse pass.

    Args:
        u: ``[B, T, 3D]``; weight ``[3, D]``; h0 ``[B, D]`` or None (zeros);
        states: ``[B, T, D]`` the converged forward states.
        grad_states: ``[B, T, D]`` ``∂L/∂states`` (any strides).

    Returns:
        ``grad_u [B, T, 3D]`` (u's dtype), ``grad_h0 [B, D]`` (u's dtype),
        ``grad_weight [3, D]`` (weight's dtype). Deterministic: no atomics, partial sums over
        the batch added in a fixed order.
    """
    batch, steps, channels = _check_layer(u, weight, h0)
    for name, tensor in (("states", states), ("grad_states", grad_states)):
        if tuple(tensor.shape) != (batch, steps, channels):
            raise ValueError(
                f"{name} must be [B, T, D] = [{batch}, {steps}, {channels}], "
                f"got {tuple(tensor.shape)}"
            )
    # The fastest measured tiles: long and narrow while B·D is small (few programs walk long
    # sequences), 128 x 8 otherwise.
    narrow = batch * channels <= 2**10
    block_t = block_t or (512 if narrow else 128)
    block_d = block_d or min(4 if narrow else 8, _next_power_of_2(channels))
    n_d = math.ceil(channels / block_d)
    dev = u.device
    u = u.contiguous()
    h0_t = torch.zeros(batch, channels, device=dev, dtype=u.dtype) if h0 is None else h0
    grad_u = torch.empty_like(u)
    grad_h0 = torch.empty(batch, channels, device=dev, dtype=u.dtype)
    partial = torch.empty(batch, n_d, 3, block_d, device=dev, dtype=torch.float32)
    torch.library.wrap_triton(_kernels().gru_backward_kernel)[(n_d, batch)](
        u,
        weight.detach().contiguous(),
        h0_t.contiguous(),
        states.contiguous(),
        grad_states.contiguous(),
        grad_u,
        grad_h0,
        partial,
        steps,
        channels,
        BLOCK_T=block_t,
        BLOCK_D=block_d,
        num_warps=num_warps,
    )
    grad_weight = partial.permute(2, 0, 1, 3).reshape(3, batch, n_d * block_d)[..., :channels]
    return grad_u, grad_h0, grad_weight.sum(dim=1).to(weight.dtype)


def fused_gru_sequential(
    u: Tensor,
    weight: Tensor,
    h0: Tensor | None = None,
    *,
    block_d: int | None = None,
    rows: int | None = None,
    num_warps: int | None = None,
) -> Tensor:
    """The GRU recurrence one step at a time in one kernel: ``u [B, T, 3D]`` -> ``[B, T, D]``.

    ``block_d`` channels per program and ``rows`` steps per loaded and stored tile; the defaults
    are the fastest measured (16 x 4 while ``B·D < 2^15``, 64 x 1 above).
    """
    batch, steps, channels = _check_layer(u, weight, h0)
    dev = u.device
    auto_d, auto_rows, auto_warps = _sequential_plan(batch, channels)
    block_d = block_d or auto_d
    rows = rows or auto_rows
    num_warps = num_warps or auto_warps
    h0_t = torch.zeros(batch, channels, device=dev, dtype=u.dtype) if h0 is None else h0
    out = torch.empty(batch, steps, channels, device=dev, dtype=u.dtype)
    torch.library.wrap_triton(_kernels().gru_sequential_kernel)[
        (math.ceil(channels / block_d), batch)
    ](
        u.contiguous(),
        weight.detach().contiguous(),
        h0_t.contiguous(),
        out,
        steps,
        channels,
        ROWS=rows,
        BLOCK_D=block_d,
        num_warps=num_warps,
    )
    return out


def reference_gru_sequential(u: Tensor, weight: Tensor, h0: Tensor | None = None) -> Tensor:
    """Pure-torch GRU recurrence (the oracle): ``u [B, T, 3D]``, ``weight [3, D]`` -> ``[B, T, D]``.

    Runs in ``u``'s dtype on any device and is differentiable by autograd.
    """
    batch, _steps, width = u.shape
    channels = width // 3
    a_z, a_r, a_c = weight
    h = u.new_zeros(batch, channels) if h0 is None else h0
    out = []
    for u_t in u.unbind(1):
        u_z, u_r, u_c = torch.split(u_t, channels, dim=-1)
        z = torch.sigmoid(u_z + a_z * h)
        r = torch.sigmoid(u_r + a_r * h)
        c = torch.tanh(u_c + a_c * r * h)
        h = h + z * (c - h)
        out.append(h)
    return torch.stack(out, dim=1)
