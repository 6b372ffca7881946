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


# Programs of the Newton kernel one multiprocessor keeps resident (register-bound).
_RESIDENT_PER_SM: Final = 3


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

    Cost model: a program walks ``ceil(T / (S · block_t))`` chunks one after the other, so with
    ``P = B · ceil(D / block_d)`` programs and ``R`` resident per multiprocessor the time is
    about ``passes(S) · ceil(P · S / (R · SMs)) · ceil(T / (S · block_t))`` chunk times, with
    one pass for ``S = 1`` and two (guess, then corrected) for ``S > 1``. The plan takes the
    ``S`` (a power of two, chunks of at least one per segment) that minimises it.
    """
    block_t = block_t or 128
    block_d = block_d or min(16, _next_power_of_2(channels))
    if segments is None:
        programs = batch * math.ceil(channels / block_d)
        slots = _RESIDENT_PER_SM * multiprocessor_count(device)
        chunks = math.ceil(steps / block_t)
        best, segments = math.inf, 1
        s = 1
        while s <= chunks:
            cost = (1 if s == 1 else 2) * math.ceil(programs * s / slots) * math.ceil(chunks / s)
            if cost < best:
                best, segments = cost, s
            s *= 2
    if segments < 1:
        raise ValueError(f"segments must be >= 1, got {segments}")
    return FusedPlan(block_t, block_d, segments, num_warps or 4)


# Cost-model constants (H200, float32; docs/benchmarks.md has the measurements behind them).
#: Time of one sequential step of one wave of programs, and programs per multiprocessor per wave.
SEQUENTIAL_STEP_S: Final = 0.55e-6
_SEQUENTIAL_PER_SM: Final = 8
#: Time of one Newton chunk of ``block_t = 128`` steps (about four cell evaluations and scans).
NEWTON_CHUNK_S: Final = 8.0e-6
#: Device bandwidth the byte floor uses (the measured copy bandwidth of an H200).
HBM_BYTES_PER_S: Final = 4.3e12


def choose_fused_gru_method(
    batch: int, steps: int, channels: int, device: torch.device, dtype: torch.dtype
) -> Literal["newton", "sequential"]:
    """Fused Newton or the fused sequential kernel for a ``[B, T, D]`` GRU layer: the faster one.

    Both read ``u`` once and write the states once, so both cost at least the byte floor
    ``(3 + 1) · B·T·D · size / bandwidth``. The sequential kernel adds ``T`` steps of latency per
    wave of programs; Newton adds the chunk time of its plan (:func:`plan_fused_gru`). The model
    picks the smaller estimate.
    """
    size = torch.empty((), dtype=dtype).element_size()
    floor = 4 * batch * steps * channels * size / HBM_BYTES_PER_S
    sms = multiprocessor_count(device)
    seq_programs = batch * math.ceil(channels / 32)
    seq = max(
        floor, steps * SEQUENTIAL_STEP_S * math.ceil(seq_programs / (_SEQUENTIAL_PER_SM * sms))
    )
    plan = plan_fused_gru(batch, steps, channels, device)
    programs = batch * math.ceil(channels / plan.block_d) * plan.segments
    waves = math.ceil(programs / (_RESIDENT_PER_SM * sms))
    chunks = math.ceil(steps / (plan.segments * plan.block_t))
    passes = 1 if plan.segments == 1 else 2
    newton = max(floor * passes, passes * waves * chunks * NEWTON_CHUNK_S * plan.block_t / 128)
    return "newton" if newton <= seq else "sequential"


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
    block_t: int = 64,
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
    block_d = block_d or min(16, _next_power_of_2(channels))
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
    u: Tensor, weight: Tensor, h0: Tensor | None = None, *, block_d: int | None = None
) -> Tensor:
    """The GRU recurrence one step at a time in one kernel: ``u [B, T, 3D]`` -> ``[B, T, D]``.

    ``block_d`` (channels per program) defaults to the largest power of two up to 128 that still
    gives every multiprocessor a program.
    """
    batch, steps, channels = _check_layer(u, weight, h0)
    dev = u.device
    if block_d is None:
        block_d = min(128, _next_power_of_2(channels))
        while block_d > 16 and batch * math.ceil(channels / block_d) < multiprocessor_count(dev):
            block_d //= 2
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
        BLOCK_D=block_d,
        num_warps=max(1, min(4, block_d // 32)),
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
