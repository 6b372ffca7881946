"""The launchers every fused cell layer shares: validation, plan, cost model, segments, stats.

A cell's fused kernels (Newton, backward, sequential) take the same arguments whatever the cell
(its recurrent parameters stacked into one ``[R, D]`` row table), so one launcher per kernel kind
serves every cell; :class:`CellSpec` says what differs (gates, state components, parameters,
kernels, defaults, cost factors). The public, typed wrappers live in :mod:`.gru`, :mod:`.lstm`
and :mod:`.slstm`.

Layouts (contiguous): ``u [B, T, G·D]`` (G gate blocks of D channels); states ``[B, T, D]`` for a
diagonal cell (one component) and ``[B, T, D, k]`` for a block cell (k components per channel);
``h0`` ``[B, D]`` / ``[B, D, k]``. Arithmetic in float32 whatever the storage dtype.
"""

from __future__ import annotations

import functools
import importlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

import torch
from torch import Tensor

from .._launch import launchable
from ..dispatch import (
    TRITON_STORAGE_DTYPES,
    multiprocessor_count,
    supports_bf16,
    triton_installed,
    triton_interpret_mode,
)
from ..scan.launch import triton_next_power_of_2

__all__ = [
    "FUSED_DEFAULT_TOL",
    "HBM_BYTES_PER_S",
    "NEWTON_CHUNK_S",
    "NEWTON_SM_CHUNK_S",
    "SEGMENTS_FIXED_S",
    "SEGMENT_CHUNK_FACTOR",
    "SEGMENT_LINK_S",
    "SEQUENTIAL_STEP_S",
    "CellSpec",
    "FusedNewtonResult",
    "FusedPlan",
    "InitialGuess",
    "check_fused_supported",
    "summarize_fused_stats",
]

#: The fused Newton kernels' initial guesses (``GUESS`` of the kernels): ``"initial_state"`` the
#: empty state, ``"step"`` one step from it, ``"uncoupled"`` each chunk's states with the couplings
#: to the previous state dropped (the recurrent weights; ParaLSTM's forget peephole too), solved
#: exactly from the chunk's start state by a scan -- the part of the memory that does not depend
#: on ``h``, which one Newton update would otherwise spend on.
InitialGuess = Literal["step", "initial_state", "uncoupled"]
_GUESS_CODES: Final[dict[str, int]] = {"initial_state": 0, "step": 1, "uncoupled": 2}

#: The per-chunk stopping tolerance when none is given: float32 arithmetic resolves residuals of
#: states in ``[-1, 1]`` to about this, so a tighter one only spends iterations.
FUSED_DEFAULT_TOL: Final = 1.0e-6


@dataclass(frozen=True)
class FusedPlan:
    """Launch shape of a fused Newton kernel (:func:`~pararnn_kernels.fused.fused_gru_newton`,
    :func:`~pararnn_kernels.fused.fused_lstm_newton`,
    :func:`~pararnn_kernels.fused.fused_slstm_newton`).

    Attributes:
        block_t: steps per chunk (a power of two).
        block_d: channels per program (a power of two).
        segments: time segments (1: every chunk starts from the exact state; more: segments
            start from guesses, then correct their first chunks from the previous segment's
            end state, on the device).
        num_warps: warps per program.
    """

    block_t: int = 128
    block_d: int = 16
    segments: int = 1
    num_warps: int = 4


@dataclass(frozen=True)
class FusedNewtonResult:
    """What a fused Newton solve returns.

    The kernels leave their statistics on the device (``stats``); ``iters``, ``residuals`` and
    ``max_residual`` read them back on first use (one host sync). A caller that must not wait
    copies ``stats`` to the host without blocking and summarizes the copy later with
    :func:`summarize_fused_stats`.

    Attributes:
        states: ``[B, T, D]`` (diagonal cells) or ``[B, T, D, k]`` (block cells), the storage
            dtype of ``u``.
        passes: walks over the chunks: 1 without segments, 2 with them (the second, correcting
            walk of each segment stops where the correction has died out, often after one
            chunk).
        plan: the launch shape used.
        stats: ``[H + 1]`` float32 on the device, the maxima the kernels' atomics wrote: entry
            k < H - 1 the residual before update k, entry H - 1 the largest residual a chunk
            stopped at (and, with segments, the largest start-state mismatch a correcting walk
            stopped at), entry H the most updates any chunk ran.
        iters: the most Newton updates any chunk ran (over all passes).
        residuals: per update index k, the max over chunks (and passes) of the residual
            before update k (chunks that had stopped do not count); ``iters + 1`` entries;
            ``inf`` marks a non-finite residual.
        max_residual: the largest residual any chunk stopped at (or start mismatch a correcting
            walk stopped at); ``inf`` when any residual is not finite.
    """

    states: Tensor
    passes: int
    plan: FusedPlan
    stats: Tensor

    @functools.cached_property
    def _summary(self) -> tuple[int, tuple[float, ...], float]:
        return summarize_fused_stats(self.stats.tolist())

    @property
    def iters(self) -> int:
        return self._summary[0]

    @property
    def residuals(self) -> tuple[float, ...]:
        return self._summary[1]

    @property
    def max_residual(self) -> float:
        return self._summary[2]


def summarize_fused_stats(values: Sequence[float]) -> tuple[int, tuple[float, ...], float]:
    """``(iters, residuals, max_residual)`` of :class:`FusedNewtonResult` from its ``stats``
    read back (``values``, ``H + 1`` numbers)."""
    if len(values) < 2:
        raise ValueError(f"values must hold the kernels' H + 1 >= 2 stats, got {len(values)}")
    hist_len = len(values) - 1
    most = int(values[-1])
    residuals = tuple(float(v) for v in values[: most + 1])
    stopped = float(values[hist_len - 1])
    worst = stopped
    if any(not math.isfinite(v) for v in (*residuals, stopped)):
        worst = math.inf
    return most, residuals, worst


#: ``step(state, u_t, rows) -> new state``: one step of the cell in torch on any leading axes;
#: ``state [..., D]`` (diagonal) or ``[..., D, k]``, ``u_t [..., G·D]``, ``rows [R, D]``.
TorchStep = Callable[[Tensor, Tensor, Tensor], Tensor]


@dataclass(frozen=True)
class CellSpec:
    """What the shared launchers need to know about one cell.

    Attributes:
        name: the cell as messages name it (``"GRU"``).
        gates: the gate blocks of ``u`` in order (``u`` is ``[B, T, len(gates)·D]``).
        components: the state components per channel; one: the diagonal layout ``[B, T, D]``,
            k: the block layout ``[B, T, D, k]``.
        weights: per recurrent parameter, its argument name and row names; the kernels get the
            rows of all of them stacked in this order (``[R, D]``).
        kernels: the kernel module (in this package) with ``{prefix}_newton_kernel``,
            ``{prefix}_backward_kernel`` and ``{prefix}_sequential_kernel``.
        prefix: the kernels' name prefix.
        step: the cell step in torch (segment guesses and the pure-torch reference).
        empty: the empty state's value per component (zeros except sLSTM's log-normaliser).
        block_t: default Newton chunk (steps), picked so the scan tuple fits in registers.
        backward_tile: the backward's default ``(block_t, block_d, num_warps)`` while ``B·D``
            is above ``2^10``.
        newton_work: a Newton chunk's multiprocessor time in units of the GRU's (cost model:
            what bounds many programs per multiprocessor).
        newton_latency: a Newton chunk's latency in units of the GRU's (cost model: what
            bounds a program alone on its multiprocessor).
        sequential_work: one sequential step in units of the GRU's (cost model).
        sequential_bw_share: the share of the copy bandwidth the sequential kernel reaches when
            ``B·D`` fills the GPU (cost model).
        sequential_rows: steps per tile of the sequential kernel's default plan, while ``B·D``
            is small and once it fills the GPU (:func:`sequential_plan`).
        block_d: default Newton channels per program while ``B·D`` is below ``2^15`` (8 from
            there).
        wide_block_t: default Newton chunk once ``B·D`` reaches ``2^15``.
        num_warps: default warps of a Newton program while ``B·D`` is below ``2^15`` (2 from
            there).
        backward_narrow: the backward's default ``(block_t, block_d, num_warps)`` while
            ``B·D <= 2^10`` (few programs walk long sequences: long, narrow tiles).
    """

    name: str
    gates: tuple[str, ...]
    components: tuple[str, ...]
    weights: tuple[tuple[str, tuple[str, ...]], ...]
    kernels: str
    prefix: str
    step: TorchStep
    empty: tuple[float, ...]
    block_t: int
    backward_tile: tuple[int, int, int]
    newton_work: float
    newton_latency: float
    sequential_work: float
    sequential_bw_share: float
    sequential_rows: tuple[int, int]
    block_d: int = 4
    wide_block_t: int = 64
    num_warps: int = 2
    backward_narrow: tuple[int, int, int] = (128, 2, 2)

    @property
    def k(self) -> int:
        """State components per channel (1 for a diagonal cell)."""
        return len(self.components)

    @property
    def rows(self) -> int:
        """Rows of the stacked parameter table."""
        return sum(len(names) for _name, names in self.weights)

    def state_tail(self, channels: int) -> tuple[int, ...]:
        """One state without the batch axis: ``(D,)`` or ``(D, k)``."""
        return (channels,) if self.k == 1 else (channels, self.k)

    def state_layout(self, lead: str) -> str:
        """``[B, D]``-style layout text with ``lead`` axes first (for messages)."""
        return f"[{lead}, D]" if self.k == 1 else f"[{lead}, D, {self.k}]"

    def empty_state(
        self, shape: Sequence[int], channels: int, device: torch.device, dtype: torch.dtype
    ) -> Tensor:
        """The empty state on leading axes ``shape``: ``[*shape, D]`` or ``[*shape, D, k]``."""
        state = torch.zeros(*shape, *self.state_tail(channels), device=device, dtype=dtype)
        for j, value in enumerate(self.empty):
            if value != 0.0:
                state[..., j] = value
        return state


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


def check_layer(
    spec: CellSpec, u: Tensor, weights: Sequence[Tensor], h0: Tensor | None
) -> tuple[int, int, int]:
    """Validate a layer's tensors; ``(B, T, D)``. Messages name the argument, expected, actual."""
    n_gates = len(spec.gates)
    if not isinstance(u, Tensor) or u.dim() != 3:
        raise ValueError(
            f"u must be [B, T, {n_gates}D], got shape {tuple(getattr(u, 'shape', ()))}"
        )
    batch, steps, width = u.shape
    if width % n_gates != 0:
        raise ValueError(
            f"u's last axis must be {n_gates}D (gates {', '.join(spec.gates)}), got {width}"
        )
    channels = width // n_gates
    if steps < 1:
        raise ValueError(f"u must have T >= 1 steps, got T={steps}")
    for (name, rows), weight in zip(spec.weights, weights, strict=True):
        if not isinstance(weight, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(weight).__name__}")
        if tuple(weight.shape) != (len(rows), channels):
            raise ValueError(
                f"{name} must be [{len(rows)}, D] = [{len(rows)}, {channels}], "
                f"got {tuple(weight.shape)}"
            )
        if weight.device != u.device:
            raise ValueError(f"{name} is on {weight.device}, u on {u.device}")
    if h0 is not None:
        expected = (batch, *spec.state_tail(channels))
        if tuple(h0.shape) != expected:
            given = ", ".join(str(n) for n in expected)
            raise ValueError(
                f"h0 must be {spec.state_layout('B')} = [{given}], got {tuple(h0.shape)}"
            )
        if h0.device != u.device:
            raise ValueError(f"h0 is on {h0.device}, u on {u.device}")
    check_fused_supported(u)
    return batch, steps, channels


def _check_states(
    spec: CellSpec, name: str, tensor: Tensor, batch: int, steps: int, d: int
) -> None:
    expected = (batch, steps, *spec.state_tail(d))
    if tuple(tensor.shape) != expected:
        given = ", ".join(str(n) for n in expected)
        raise ValueError(
            f"{name} must be {spec.state_layout('B, T')} = [{given}], got {tuple(tensor.shape)}"
        )


#: ``(kernel module, prefix, kind) -> @triton.jit kernel``, looked up once.
_KERNELS: dict[tuple[str, str, str], Any] = {}


def _kernel(spec: CellSpec, kind: str) -> Any:
    key = (spec.kernels, spec.prefix, kind)
    if key not in _KERNELS:
        module = importlib.import_module(f".{spec.kernels}", __package__)
        _KERNELS[key] = getattr(module, f"{spec.prefix}_{kind}_kernel")
    return launchable(_KERNELS[key])


def _stacked(weights: Sequence[Tensor]) -> Tensor:
    """The kernels' ``[R, D]`` parameter table (rows of every parameter, in order)."""
    if len(weights) == 1:
        return weights[0].detach().contiguous()
    return torch.cat([w.detach() for w in weights]).contiguous()


# Cost-model constants, measured in float32 with benchmarks/bench_fused.py and a time-segment
# sweep (docs/benchmarks.md, 2026-12-06; on an H100, whose 132 multiprocessors and clocks match
# the H200's: the GRU kernels' times there were within 3 % of the H200's of 2026-12-05). A
# program walks its chunks one after the other: a 128-step chunk of a 4-channel tile takes
# NEWTON_CHUNK_S when its program is alone on a multiprocessor, and programs sharing one take
# NEWTON_SM_CHUNK_S of its time per chunk each, so a call takes the longer of the chain of one
# program's chunks and the multiprocessors' share of all of them, plus NEWTON_FIXED_S. Time
# segments add SEGMENTS_FIXED_S (their flags and chunk records), make every chunk take
# SEGMENT_CHUNK_FACTOR times as long (the chained kernel's chunk loop) and lengthen the chain by
# a link per segment after the first (SEGMENT_LINK_S: its correcting walk, typically one chunk,
# and the handover of its end state). The block cells scale the chunk times by their CellSpec
# factors. The sequential kernel takes SEQUENTIAL_STEP_S per step per wave and reaches its
# CellSpec's sequential_bw_share of the copy bandwidth when B·D fills the GPU. Against the 115
# Newton times of 2026-12-06 (every cell; T = 256-65536, B = 1-64; every plan and segment count
# timed) the unsegmented estimates were 0.72-1.35x, median 1.01. The segment constants are
# fitted to 108 CUDA-graph times of the chained kernels (2026-12-06: every cell, B·D = 64-2048,
# T = 4096-65536, 1-32 segments; estimates 0.48-1.49x, log-rms 0.15); the planned segment
# counts ran within 1.10x of the fastest count timed at each of the 18 shapes.
NEWTON_CHUNK_S: Final = 2.9e-6
NEWTON_SM_CHUNK_S: Final = 1.05e-6
NEWTON_FIXED_S: Final = 0.02e-3
SEGMENTS_FIXED_S: Final = 0.01e-3
SEGMENT_CHUNK_FACTOR: Final = 1.2
SEGMENT_LINK_S: Final = 6.0e-6
SEQUENTIAL_STEP_S: Final = 0.12e-6
#: The copy bandwidth of an H200 (bytes read plus written per second), for the byte floor.
HBM_BYTES_PER_S: Final = 4.3e12
_SEQUENTIAL_PER_SM: Final = 8
# From this many channels in total (B·D) the kernels are throughput-bound: larger tiles.
_WIDE: Final = 2**15
# Up to this many channels in total (B·D) the backward takes the cell's narrow tile.
_NARROW_BACKWARD: Final = 2**10


def plan_fused(
    spec: CellSpec,
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
    """The Newton launch shape for ``spec``; the model is in ``plan_fused_gru``'s docstring."""
    wide = batch * channels >= _WIDE
    block_t = block_t or (spec.wide_block_t if wide else spec.block_t)
    block_d = block_d or min(8 if wide else spec.block_d, triton_next_power_of_2(channels))
    if segments is None:
        sms = multiprocessor_count(device)
        segments = _segment_count(spec, batch, steps, channels, block_t, block_d, sms)
    if segments < 1:
        raise ValueError(f"segments must be >= 1, got {segments}")
    return FusedPlan(block_t, block_d, segments, num_warps or (2 if wide else spec.num_warps))


@functools.lru_cache(maxsize=4096)
def _segment_count(
    spec: CellSpec,
    batch: int,
    steps: int,
    channels: int,
    block_t: int,
    block_d: int,
    multiprocessors: int,
) -> int:
    """The fewest segments of the fastest estimate, powers of two while there are at most four
    programs per multiprocessor (more than can be resident at once serialise) and a chunk per
    segment: segments shorten each program's chain of chunks, but add a link per segment to it
    and a fixed cost. Cached: every call without a plan asks, and a layer's shapes repeat."""
    programs = batch * math.ceil(channels / block_d)
    chunks = math.ceil(steps / block_t)
    candidates = [1]
    while programs * 2 * candidates[-1] <= 4 * multiprocessors and 2 * candidates[-1] <= chunks:
        candidates.append(2 * candidates[-1])
    return min(
        candidates,
        key=lambda s: _newton_seconds(
            spec, batch, steps, channels, block_t, block_d, s, multiprocessors, 0.0
        ),
    )


def _newton_seconds(
    spec: CellSpec,
    batch: int,
    steps: int,
    channels: int,
    block_t: int,
    block_d: int,
    segments: int,
    multiprocessors: int,
    floor: float,
) -> float:
    """The cost model's time of one fused Newton call on a plan (see :func:`estimate_seconds`)."""
    programs = batch * math.ceil(channels / block_d) * segments
    lengths = math.ceil(steps / (segments * block_t)) * block_t / 128  # 128-step chunks
    slower = 1.0 if segments == 1 else SEGMENT_CHUNK_FACTOR  # the chained kernel's chunks
    chain = (
        lengths * NEWTON_CHUNK_S * slower + (segments - 1) * SEGMENT_LINK_S
    ) * spec.newton_latency
    share = programs * lengths * NEWTON_SM_CHUNK_S * slower * spec.newton_work * max(block_d, 4) / 4
    fixed = NEWTON_FIXED_S + (0.0 if segments == 1 else SEGMENTS_FIXED_S)
    # The longer of the two, smoothed where they are close (there both limit a call).
    busy = float((chain**4 + (share / multiprocessors) ** 4) ** 0.25)
    return fixed + max(floor, busy)


def sequential_plan(spec: CellSpec, batch: int, channels: int) -> tuple[int, int, int, int]:
    """``(block_d, rows, num_warps, vec)`` of the sequential kernel.

    64 channels, one warp, 2 channels per thread, so that every thread holds all the tile's
    steps of its channels, and ``spec.sequential_rows`` steps per tile: its first entry while
    ``B·D`` is below ``2^15``, its second from there. The fastest plans of the sweeps in
    docs/benchmarks.md (``B·D`` from 256 to 65536): 16 steps for the GRU, 8 for ParaLSTM,
    8 and then 4 for ParaSLSTM (16 spill in both block cells).
    """
    narrow, wide = spec.sequential_rows
    rows = wide if batch * channels >= _WIDE else narrow
    return min(64, triton_next_power_of_2(channels)), rows, 1, 2


def estimate_seconds(
    spec: CellSpec,
    batch: int,
    steps: int,
    channels: int,
    device: torch.device,
    dtype: torch.dtype,
) -> dict[str, float]:
    """The cost model's forward time of each fused kernel, ``{"newton": s, "sequential": s}``.

    Both read ``u`` once and write the states once: the byte floor is
    ``(G + k) · B·T·D · size / bandwidth``. Sequential: ``T`` steps of
    ``SEQUENTIAL_STEP_S · sequential_work`` per wave of programs, or the floor over its share of
    the bandwidth (``sequential_bw_share``). Newton: the longest of the floor, one program's
    chain of chunks (``NEWTON_CHUNK_S · newton_latency`` per 128 steps, and
    ``SEGMENT_LINK_S · newton_latency`` per segment after the first) and the multiprocessors'
    share of every program's chunks (``NEWTON_SM_CHUNK_S · newton_work · max(block_d, 4) / 4``
    each per 128 steps; the last two smoothed where they are close), plus ``NEWTON_FIXED_S``
    (with segments: chunks ``SEGMENT_CHUNK_FACTOR`` times as long, and ``SEGMENTS_FIXED_S``).
    """
    size = dtype.itemsize
    floor = (len(spec.gates) + spec.k) * batch * steps * channels * size / HBM_BYTES_PER_S
    sms = multiprocessor_count(device)
    seq_block_d = sequential_plan(spec, batch, channels)[0]
    seq_waves = math.ceil(batch * math.ceil(channels / seq_block_d) / (_SEQUENTIAL_PER_SM * sms))
    seq_step = SEQUENTIAL_STEP_S * spec.sequential_work
    sequential = max(floor / spec.sequential_bw_share, steps * seq_step * seq_waves)
    plan = plan_fused(spec, batch, steps, channels, device)
    newton = _newton_seconds(
        spec, batch, steps, channels, plan.block_t, plan.block_d, plan.segments, sms, floor
    )
    return {"newton": newton, "sequential": sequential}


def choose_method(
    spec: CellSpec,
    batch: int,
    steps: int,
    channels: int,
    device: torch.device,
    dtype: torch.dtype,
) -> Literal["newton", "sequential"]:
    """Fused Newton or fused sequential for one layer of ``spec``: the smaller estimate of
    :func:`estimate_seconds`."""
    estimate = estimate_seconds(spec, batch, steps, channels, device, dtype)
    return "newton" if estimate["newton"] <= estimate["sequential"] else "sequential"


def newton(
    spec: CellSpec,
    u: Tensor,
    weights: Sequence[Tensor],
    h0: Tensor | None,
    *,
    max_iters: int,
    tol: float | None,
    omega: float,
    initial_guess: InitialGuess,
    plan: FusedPlan | None,
) -> FusedNewtonResult:
    """Chunked fused Newton for any cell (the public wrappers document the arguments).

    With segments, one launch does everything on the device: every segment after the first
    runs from a guessed start state (the initial guess one step before it, computed by its
    programs), then waits for the previous segment's final end state and walks its chunks again
    from it until a chunk's start state is within ``tol`` of the one its states were solved
    from (the kernel modules' section "time segments chained on the device"). Nothing is read
    back to the host, so segments capture in CUDA graphs too.
    """
    batch, steps, channels = check_layer(spec, u, weights, h0)
    if not isinstance(max_iters, int) or max_iters < 1:
        raise ValueError(f"max_iters must be an int >= 1, got {max_iters!r}")
    if initial_guess not in _GUESS_CODES:
        raise ValueError(
            f"initial_guess must be one of {sorted(_GUESS_CODES)}, got {initial_guess!r}"
        )
    tol = FUSED_DEFAULT_TOL if tol is None else float(tol)
    plan = plan or plan_fused(spec, batch, steps, channels, u.device)
    u = u.contiguous()
    rows = _stacked(weights)
    dev = u.device
    n_d = math.ceil(channels / plan.block_d)
    segments = min(plan.segments, math.ceil(steps / plan.block_t))
    seg_len = math.ceil(math.ceil(steps / segments) / plan.block_t) * plan.block_t
    segments = math.ceil(steps / seg_len)
    hist_len = triton_next_power_of_2(max_iters + 2)

    # Host-side work is a large share of a call at moderate sizes: as few tensor ops as can be
    # (h0 is read as it is; later segments compute their start guesses on the device).
    tail = spec.state_tail(channels)
    start = spec.empty_state((batch,), channels, dev, torch.float32) if h0 is None else h0
    start = start.contiguous()
    # Maxima over every program, written by the kernels' atomics: entry k the residual before
    # update k, entry hist_len - 1 the largest a chunk stopped at, then the most updates any
    # chunk ran.
    stats = torch.zeros(hist_len + 1, device=dev, dtype=torch.float32)
    if segments == 1:
        ends = chunk_starts = sync = stats  # none is touched with one segment
    else:
        ends = torch.empty(segments, batch, *tail, device=dev, dtype=torch.float32)
        n_chunks = math.ceil(steps / plan.block_t)
        chunk_starts = torch.empty(batch, n_chunks, *tail, device=dev, dtype=torch.float32)
        # The ticket counter, then one flag per program.
        sync = torch.zeros(1 + segments * batch * n_d, device=dev, dtype=torch.int32)
    out = torch.empty(batch, steps, *tail, device=dev, dtype=u.dtype)
    _kernel(spec, "newton")[(n_d, batch, segments)](
        u,
        rows,
        start,
        out,
        ends,
        chunk_starts,
        sync,
        stats,
        steps,
        channels,
        seg_len,
        tol,
        float(omega),
        MAX_ITERS=max_iters,
        GUESS=_GUESS_CODES[initial_guess],
        CHAINED=segments > 1,
        HIST=hist_len,
        BLOCK_T=plan.block_t,
        BLOCK_D=plan.block_d,
        num_warps=plan.num_warps,
    )
    # The stats stay on the device until the result is asked for them.
    return FusedNewtonResult(out, 1 if segments == 1 else 2, plan, stats)


def backward(
    spec: CellSpec,
    u: Tensor,
    weights: Sequence[Tensor],
    h0: Tensor | None,
    states: Tensor,
    grad_states: Tensor,
    *,
    block_t: int | None,
    block_d: int | None,
    num_warps: int | None,
) -> tuple[Tensor, Tensor, list[Tensor]]:
    """Eq. 2.6 backward for any cell: ``grad_u``, ``grad_h0`` and one gradient per parameter."""
    batch, steps, channels = check_layer(spec, u, weights, h0)
    for name, tensor in (("states", states), ("grad_states", grad_states)):
        _check_states(spec, name, tensor, batch, steps, channels)
    # The fastest measured tiles: long and narrow while B·D is small (few programs walk long
    # sequences), the cell's default tile otherwise.
    tile = spec.backward_narrow if batch * channels <= _NARROW_BACKWARD else spec.backward_tile
    block_t = block_t or tile[0]
    block_d = block_d or min(tile[1], triton_next_power_of_2(channels))
    num_warps = num_warps or tile[2]
    n_d = math.ceil(channels / block_d)
    dev = u.device
    u = u.contiguous()
    if h0 is None:
        h0 = spec.empty_state((batch,), channels, dev, u.dtype)
    grad_u = torch.empty_like(u)
    grad_h0 = torch.empty(batch, *spec.state_tail(channels), device=dev, dtype=u.dtype)
    n_rows = spec.rows
    partial = torch.empty(n_rows, batch, n_d * block_d, device=dev, dtype=torch.float32)
    _kernel(spec, "backward")[(n_d, batch)](
        u,
        _stacked(weights),
        h0.contiguous(),
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
    # Per-program partials summed over the batch in a fixed order: bit-identical on repeat.
    summed = partial[..., :channels].sum(dim=1)
    grads = [
        g.to(w.dtype)
        for g, w in zip(
            torch.split(summed, [len(names) for _name, names in spec.weights]),
            weights,
            strict=True,
        )
    ]
    return grad_u, grad_h0, grads


def sequential(
    spec: CellSpec,
    u: Tensor,
    weights: Sequence[Tensor],
    h0: Tensor | None,
    *,
    block_d: int | None,
    rows: int | None = None,
    num_warps: int | None = None,
    vec: int | None = None,
) -> Tensor:
    """The recurrence one step at a time in one kernel, for any cell (:func:`sequential_plan`)."""
    batch, steps, channels = check_layer(spec, u, weights, h0)
    dev = u.device
    auto_d, auto_rows, auto_warps, auto_vec = sequential_plan(spec, batch, channels)
    block_d = block_d or auto_d
    num_warps = num_warps or auto_warps
    rows = rows or auto_rows
    vec = vec or min(auto_vec, block_d)
    for name, value in (("block_d", block_d), ("rows", rows)):
        if value < 1 or value & (value - 1):
            raise ValueError(f"{name} must be a power of two, got {value}")
    if vec < 1 or vec & (vec - 1) or vec > block_d:
        raise ValueError(f"vec must be a power of two from 1 to block_d = {block_d}, got {vec}")
    if h0 is None:
        h0 = spec.empty_state((batch,), channels, dev, u.dtype)
    out = torch.empty(batch, steps, *spec.state_tail(channels), device=dev, dtype=u.dtype)
    _kernel(spec, "sequential")[(math.ceil(channels / block_d), batch)](
        u.contiguous(),
        _stacked(weights),
        h0.contiguous(),
        out,
        steps,
        channels,
        ROWS=rows,
        BLOCK_D=block_d,
        VEC=vec,
        num_warps=num_warps,
    )
    return out


def reference_sequential(
    spec: CellSpec, u: Tensor, weights: Sequence[Tensor], h0: Tensor | None
) -> Tensor:
    """Pure-torch recurrence in ``u``'s dtype on any device, differentiable by autograd."""
    batch, _steps, width = u.shape
    channels = width // len(spec.gates)
    rows = weights[0] if len(weights) == 1 else torch.cat(list(weights))
    state = spec.empty_state((batch,), channels, u.device, u.dtype) if h0 is None else h0
    out = []
    for u_t in u.unbind(1):
        state = spec.step(state, u_t, rows)
        out.append(state)
    return torch.stack(out, dim=1)
