"""Typed launchers of the Triton scan kernels, and the launch plan that picks among them.

The diagonal scan has five launch shapes; :func:`plan_scan_diag` picks one from the number of
channels, the storage dtype, the direction and (for the fifth) the length and the device:

* ``"chunked"`` -- one program per (batch, block of channels) walks the whole sequence, each
  thread scanning whole columns sequentially; the fastest wherever B·D alone fills the GPU.
* ``"tiles"`` -- one program per (tile of steps, block of channels), handed out in order by an
  atomic ticket; the tile is loaded once and scanned across lanes, and tiles get their exact
  incoming state by decoupled look-back over their predecessors' published monoids. One read of
  every input, one write of every output, and T fills the GPU when B·D cannot.
* ``"lookback"`` -- the same tiles and look-back, but each thread walks a run of consecutive
  steps sequentially and only the run totals are scanned across warps (fewer instructions per
  element); with ``rescan`` the tile's inputs stay in their storage dtype while it looks back
  and are scanned again from the incoming state, so a thread holds twice the steps.
* ``"twopass"`` -- the same look-back over long tiles that are never held: a first pass streams
  the tile to its monoid, a second streams it again from the incoming state. It reads the inputs
  twice (5 streams instead of 3, so at most 60 % of the copy bandwidth by this page's measure),
  but its chain of tiles is short: the one that wins with very few channels, where the one-pass
  tiles wait on their chain.
* ``"streamed"`` -- the chunked walk with its chunks moved by the tensor memory accelerator
  (TMA; compute capability >= 9.0), several chunks in flight per program in shared memory: the
  narrow programs (32 channels) that fill the GPU where 64-channel ones are too few still keep
  enough bytes moving. Forward passes only (an adjoint takes the default plan). The default
  only for bf16 forward passes whose 32-channel programs make 2.5 to 3.5 per multiprocessor,
  up to :data:`STREAMED_MAX_STEPS` steps (:func:`plan_scan_diag`); asked for
  (``method="streamed"``) anywhere it can run.

The kernels are imported on first use, so importing this module needs no GPU and compiles nothing.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor

from .._launch import launchable, plain_eager
from ..dispatch import device_capability, multiprocessor_count

__all__ = [
    "ALIGNED_CHANNELS",
    "CHUNKED_WAVES",
    "FEW_CHANNELS",
    "LOOKBACK_WINDOW",
    "STREAMED_MAX_STEPS",
    "STREAMED_WAVES",
    "TWO_PASS_CHANNELS",
    "DiagScanPlan",
    "ScanMethod",
    "plan_scan_diag",
    "triton_scan_block_diag",
    "triton_scan_block_diag_backward",
    "triton_scan_diag",
    "triton_scan_diag_adjoint",
    "triton_scan_diag_backward",
]

ScanMethod = Literal["chunked", "lookback", "tiles", "twopass", "streamed"]

#: Predecessors a look-back round trip looks at, at most (a walk over k unfinished tiles costs
#: about k / window round trips instead of k); one atomic reads the states of 16 tiles. The
#: "lookback" kernel's short tiles take it; its tiles of 32 or 64 steps per thread take 4 (16
#: costs them registers: spills in an sm_90 compile), the "tiles" kernel takes 1 (H200,
#: 2026-12-03: the windowed walk costs it registers and was slower at (32, 4096, 512) fp32,
#: 37 % against 82 % of copy bandwidth, docs/benchmarks.md).
LOOKBACK_WINDOW = 16
#: Below this many channels (``batch * channels``) 4-byte storage takes the look-back kernel's
#: short tiles instead of the tiles kernel, and the bf16 adjoint takes rescanned tiles
#: (:func:`plan_scan_diag`).
FEW_CHANNELS = 4096
#: Below this many channels (``batch * channels``) every storage takes the two-pass look-back
#: kernel: H200, 2026-12-04, at 64 channels 53 % of copy bandwidth in fp32 and 44 % in bf16
#: against the one-pass tiles' 37 % and 24 %; at 256 channels level with them forward.
TWO_PASS_CHANNELS = 256
#: Channel counts divisible by this let Triton prove each row's start aligned (its divisibility
#: hint) and vectorize; the chunked plan takes shorter chunks without it (:func:`plan_scan_diag`).
ALIGNED_CHANNELS = 16
#: The chunked pass is picked when there are at least this many channel blocks (programs) per
#: multiprocessor: with 512 of them (3.9 per SM on an H200) it beat both look-back kernels, with
#: 256 it lost to them (H200, 2026-12-03, docs/benchmarks.md).
CHUNKED_WAVES = 3
#: bf16 forward passes take the streamed plan by default when its 32-channel programs
#: (``batch * ceil(channels / 32)``) number from the first to the second of these times the
#: multiprocessors: H100, 2026-12-07, 384 programs on 132 multiprocessors (12288 channels) ran
#: at 65-91 % of the copy bandwidth against the look-back tiles' 54-85 % for T from 1024 to
#: 32768; with 192 programs they ran at 44 % against 65 % (too few bytes in flight), with 512
#: level at T = 4096 and behind from 16384, with 768 at 70 % against 79 % (docs/benchmarks.md).
STREAMED_WAVES = (2.5, 3.5)
#: ... and only up to this many steps: at 65536 the look-back tiles led (86 % against 84 %).
STREAMED_MAX_STEPS = 32768
_CHUNKED_BLOCK_D = 64
_STREAMED_BLOCK_D = 32
#: Bytes every stride but the last of a TMA descriptor must be a multiple of (and the address).
_TMA_ALIGNMENT = 16
_TMA_CAPABILITY = (9, 0)
# Tiles whose two state bits share one int32 word in the look-back kernels (the kernels' `16`).
_TILES_PER_WORD = 16
#: The look-back kernels' flag buffers hold at least this many int32 words (a multiple of 16:
#: the kernels clear words in stripes of 16).
_MIN_FLAG_WORDS = 1 << 12
#: Look-back scratch (float32 elements) up to this size is kept from launch to launch; a larger
#: one is allocated by its launch (a scan that large takes long enough for that not to show).
_MAX_KEPT_SCRATCH = 1 << 22


@dataclass(frozen=True)
class _LookbackTile:
    block_t: int
    rows: int
    block_d: int
    window: int
    rescan: bool


# The "lookback" kernel's default tiles (plan_scan_diag says which storage takes which).
_SHORT_TILE = _LookbackTile(32, 16, 64, LOOKBACK_WINDOW, rescan=False)
_WIDE_TILE = _LookbackTile(32, 32, 128, 4, rescan=False)
_RESCAN_TILE = _LookbackTile(64, 64, 64, 4, rescan=True)


@dataclass(frozen=True)
class DiagScanPlan:
    """How one diagonal scan is launched.

    Attributes:
        method: ``"tiles"``, ``"lookback"``, ``"twopass"`` or ``"chunked"`` (module docstring).
        block_t: steps per chunk (chunked) or per tile (the look-back kernels); a power of two.
        block_d: channels per program (a power of two).
        num_warps: warps per program.
        rows: ``"lookback"``: consecutive steps each thread walks sequentially; ``"twopass"``:
            steps per chunk of its two passes (both divide block_t); 1 for the other methods.
        inclusive_every: look-back kernels only, a testing knob: only every n-th tile publishes its
            inclusive state, so successors must walk back over published monoids (1 = all do).
        window: look-back kernels only: predecessors one look-back round trip looks at, at most
            (a power of two <= 16; 1 walks back one tile per round trip). :func:`plan_scan_diag`
            picks it per method; the field's default is the one-tile walk.
        vec: ``"chunked"``, ``"lookback"`` and ``"twopass"``: channels per thread, at most (a
            power of two <= block_d); the rest of a warp's lanes spread along the channels, so each
            thread holds whole columns (all of its steps of those channels) and scans them
            sequentially.
        rescan: ``"lookback"`` only: hold the tile's inputs in their storage dtype while the
            tile looks back, and scan them again from the incoming state (instead of holding
            the float32 scan): half the registers per element for 2-byte storage.
        stages: ``"streamed"`` only: chunks in flight per program (shared-memory buffers of
            Triton's pipelined loop); 1 for the other methods.
    """

    method: ScanMethod
    block_t: int
    block_d: int
    num_warps: int = 4
    rows: int = 8
    inclusive_every: int = 1
    window: int = 1
    vec: int = 2
    rescan: bool = False
    stages: int = 1


def plan_scan_diag(
    batch: int,
    steps: int,
    channels: int,
    device: torch.device,
    *,
    dtype: torch.dtype = torch.float32,
    adjoint: bool = False,
    method: ScanMethod | None = None,
    block_t: int | None = None,
    block_d: int | None = None,
    num_warps: int | None = None,
    rows: int | None = None,
    inclusive_every: int = 1,
    window: int | None = None,
    vec: int | None = None,
    rescan: bool | None = None,
    stages: int | None = None,
) -> DiagScanPlan:
    """Launch plan for a ``[batch, steps, channels]`` diagonal scan; arguments override the model.

    What decides is how many channel blocks there are to fill the GPU with, the storage
    ``dtype`` and whether the pass is the ``adjoint`` (H200 sweeps, ``docs/benchmarks.md``):

    * ``batch * ceil(channels / 64)`` of at least :data:`CHUNKED_WAVES` times the device's
      multiprocessors: ``"chunked"``, one one-warp program per 64 channels walking the whole
      sequence 16 steps at a time, each thread holding 2 channels of every step (the scan is
      sequential inside the thread: no exchange between threads at all). 92-98 % of the copy
      bandwidth in fp32 and 77-96 % in bf16 from 1024 such programs up, forward and adjoint.
      When ``channels`` is not a multiple of :data:`ALIGNED_CHANNELS` (rows not provably
      aligned: scalar loads, more registers), 8 steps at a time: 61-82 % there against 36-67 %
      with 16.
    * fewer than :data:`TWO_PASS_CHANNELS` channels (``batch * channels``): ``"twopass"``,
      tiles of 512 steps x 64 channels streamed twice in chunks of 8 steps, one warp, window 16.
    * otherwise T has to fill the GPU too, and the look-back kernels split it into tiles.
      4-byte storage with at least :data:`FEW_CHANNELS` channels (``batch * channels``) takes
      ``"tiles"``, 64 steps x 64 channels, 4 warps (75-85 %); with fewer, ``"lookback"`` tiles
      of 32 steps (16 per thread, two warps) x 64 channels, window 16 (59-72 % at 256-2048
      channels, where the tiles kernel gave 45-75 %). bf16 takes ``"lookback"`` tiles of 64
      steps x 64 channels, all 64 steps in each thread, one warp, window 4, with ``rescan``
      (65-75 % forward where the earlier 32 x 64 tile gave 45 %, 52 % against 31 % with 256
      channels); its adjoint with at least :data:`FEW_CHANNELS` channels, and fp16 storage,
      take 32 x 128 tiles, 32 steps per thread, two warps, window 4, without (60-69 % adjoint,
      where rescan gave 53-60 %; fp16 spills with rescan: the compiler merges the two
      conversions of its inputs).
    * ``"streamed"`` (module docstring): 64-step chunks x 32 channels, one warp, 4 ``stages``.
      The default for bf16 forward passes (not the ``adjoint``) that would take the look-back
      tiles, on compute capability >= 9.0, with rows of a multiple of 16 bytes, at most
      :data:`STREAMED_MAX_STEPS` steps and ``batch * ceil(channels / 32)`` programs between
      :data:`STREAMED_WAVES` times the multiprocessors (on an H100 at 12288 channels: 84 % of
      the copy bandwidth against the look-back tiles' 74 % at T = 4096, 91 % against 83 % at
      16384). Asked for (``method="streamed"``) anywhere else, it needs compute capability >= 9.0
      and rows of a multiple of 16 bytes (``channels`` times the element size), or it raises
      ``ValueError``. At call time, a traced call (``torch.compile``, fake tensors) or a tensor
      at an address that is not 16-byte aligned runs the plan the shape would have without the
      streamed pass. It streams forward passes (either direction) only: the ``adjoint`` of a
      streamed call is its shape's default adjoint plan, whatever tile arguments came with it
      (streamed, the adjoint ran at 17-66 % of the copy bandwidth where the default ran at
      71-93 %, every shape of an H100 sweep).

    ``steps`` decides only whether a bf16 forward pass may be streamed (the cache key holds that
    bit, not the length, so sequences of most lengths share a plan). ``device`` gives the
    multiprocessor count (4 for the CPU interpreter) and, for bf16 forward passes and streamed
    ones, the compute capability. Plans are cached: every scan call asks for one, and building
    it costs more host time than the lookup. Symbolic sizes (``SymInt``, under
    ``torch.compile`` with dynamic shapes and in opcheck's dynamic test) cannot be hashed; their
    plans are built uncached, never streamed by default.
    """
    if method == "streamed" and adjoint:
        return _unstreamed_plan(batch, channels, device, dtype, adjoint)
    # Only a pass that may be streamed asks for the capability (the other calls skip it).
    streamable = (
        method is None
        and dtype == torch.bfloat16
        and not adjoint
        and type(steps) is int
        and steps <= STREAMED_MAX_STEPS
    )
    capability = device_capability(device) if method == "streamed" or streamable else None
    build = _plan if type(batch) is int and type(channels) is int else _build_plan
    return build(
        batch, channels, multiprocessor_count(device), capability, dtype, adjoint, method,
        streamable, block_t, block_d, num_warps, rows, inclusive_every, window, vec, rescan,
        stages,
    )  # fmt: skip


def _unstreamed_plan(
    batch: int, channels: int, device: torch.device, dtype: torch.dtype, adjoint: bool
) -> DiagScanPlan:
    """The default plan of a shape with the streamed pass left out (its launcher's fallback)."""
    build = _plan if type(batch) is int and type(channels) is int else _build_plan
    return build(
        batch, channels, multiprocessor_count(device), None, dtype, adjoint, None, False,
        None, None, None, None, 1, None, None, None, None,
    )  # fmt: skip


def _streams_by_default(
    batch: int,
    channels: int,
    element_size: int,
    multiprocessors: int,
    capability: tuple[int, int] | None,
) -> bool:
    """Whether a streamable bf16 forward pass (:func:`plan_scan_diag`) takes the streamed plan."""
    if capability is None or capability < _TMA_CAPABILITY:
        return False
    if channels * element_size % _TMA_ALIGNMENT:
        return False
    programs = batch * -(-channels // _STREAMED_BLOCK_D)
    low, high = STREAMED_WAVES
    return low * multiprocessors <= programs < high * multiprocessors


def _build_plan(
    batch: int,
    channels: int,
    multiprocessors: int,
    capability: tuple[int, int] | None,
    dtype: torch.dtype,
    adjoint: bool,
    method: ScanMethod | None,
    streamable: bool,
    block_t: int | None,
    block_d: int | None,
    num_warps: int | None,
    rows: int | None,
    inclusive_every: int,
    window: int | None,
    vec: int | None,
    rescan: bool | None,
    stages: int | None,
) -> DiagScanPlan:
    element_size = dtype.itemsize
    if method is None:
        blocks = batch * -(-channels // _CHUNKED_BLOCK_D)
        if blocks >= CHUNKED_WAVES * multiprocessors:
            method = "chunked"
        elif batch * channels < TWO_PASS_CHANNELS:
            method = "twopass"
        elif element_size >= 4 and batch * channels >= FEW_CHANNELS:
            method = "tiles"
        elif streamable and _streams_by_default(
            batch, channels, element_size, multiprocessors, capability
        ):
            method = "streamed"
        else:
            method = "lookback"
    if method == "tiles":
        window = _checked_window(1 if window is None else window)
        block_d = block_d or min(64, triton_next_power_of_2(channels))
        return DiagScanPlan(
            "tiles", block_t or 64, block_d, num_warps or 4, 1, inclusive_every, window
        )
    if method == "twopass":
        # 8-step chunks: 124 registers in an sm_90 compile against 222 with 16 (H200: 53 % of
        # copy against 48 % at 64 fp32 channels).
        rows = rows or 8
        block_t = _checked_tile(max(block_t or 512, rows), rows)
        block_d = block_d or min(_CHUNKED_BLOCK_D, triton_next_power_of_2(channels))
        window = _checked_window(LOOKBACK_WINDOW if window is None else window)
        return DiagScanPlan(
            "twopass", block_t, block_d, num_warps or 1, rows, inclusive_every, window,
            _vec(vec, block_d, 2),
        )  # fmt: skip
    if method == "lookback":
        if element_size >= 4:
            tile = _SHORT_TILE
        elif dtype == torch.bfloat16 and not (adjoint and batch * channels >= FEW_CHANNELS):
            tile = _RESCAN_TILE
        else:
            tile = _WIDE_TILE
        block_t = block_t or tile.block_t
        rows = rows or min(tile.rows, block_t)
        block_t = _checked_tile(max(block_t, rows), rows)
        block_d = block_d or min(tile.block_d, triton_next_power_of_2(channels))
        window = _checked_window(tile.window if window is None else window)
        # One warp per group of rows and per 64 channels: every warp scans whole columns.
        warps = max(1, min(8, block_t // rows * block_d // 64))
        return DiagScanPlan(
            "lookback", block_t, block_d, num_warps or warps, rows, inclusive_every, window,
            _vec(vec, block_d, 2), tile.rescan if rescan is None else rescan,
        )  # fmt: skip
    if method == "streamed":
        if capability is not None and capability < _TMA_CAPABILITY:
            raise ValueError(
                "method='streamed' needs the tensor memory accelerator (compute capability >= "
                f"9.0), but the device has compute capability {capability[0]}.{capability[1]}"
            )
        if channels * element_size % _TMA_ALIGNMENT:
            raise ValueError(
                f"method='streamed' needs rows of a multiple of {_TMA_ALIGNMENT} bytes (TMA): "
                f"channels * {element_size} bytes must divide by {_TMA_ALIGNMENT}, got "
                f"channels = {channels}"
            )
        _checked_window(1 if window is None else window)
        block_t = _checked_tile(block_t or 64, 1)
        block_d = block_d or min(_STREAMED_BLOCK_D, triton_next_power_of_2(channels))
        if block_d * element_size < _TMA_ALIGNMENT or block_d & (block_d - 1):
            raise ValueError(
                f"method='streamed' needs block_d a power of two of at least {_TMA_ALIGNMENT} "
                f"bytes ({_TMA_ALIGNMENT // element_size} channels of {dtype}), got {block_d}"
            )
        stages = stages or 4
        if stages < 1:
            raise ValueError(f"stages must be >= 1, got {stages}")
        return DiagScanPlan("streamed", block_t, block_d, num_warps or 1, stages=stages)
    _checked_window(1 if window is None else window)
    block_d = block_d or min(_CHUNKED_BLOCK_D, triton_next_power_of_2(channels))
    block_t = block_t or (16 if channels % ALIGNED_CHANNELS == 0 else 8)
    return DiagScanPlan("chunked", block_t, block_d, num_warps or 1, vec=_vec(vec, block_d, 2))


_plan = functools.lru_cache(maxsize=4096)(_build_plan)


def _checked_tile(block_t: int, rows: int) -> int:
    """A look-back tile of ``block_t`` steps in runs (or chunks) of ``rows``: both powers of two
    (the kernels' index ranges), so runs tile it exactly."""
    for name, value in (("block_t", block_t), ("rows", rows)):
        if value < 1 or value & (value - 1):
            raise ValueError(f"{name} must be a power of two, got {value}")
    return block_t


def _checked_window(window: int) -> int:
    if window < 1 or window > _TILES_PER_WORD or window & (window - 1):
        raise ValueError(f"window must be a power of two from 1 to {_TILES_PER_WORD}, got {window}")
    return window


def _vec(vec: int | None, block_d: int, default: int) -> int:
    vec = vec or min(default, block_d)
    if vec > block_d or vec & (vec - 1):
        raise ValueError(f"vec must be a power of two from 1 to block_d = {block_d}, got {vec}")
    return vec


def triton_next_power_of_2(n: int) -> int:
    """Smallest power of two >= n (n >= 1)."""
    return 1 << max(0, n - 1).bit_length()


@functools.cache
def _kernels() -> Any:
    # Imported on first use (module docstring); cached, as an import statement costs a few µs
    # of host time at every scan call.
    from . import _kernels

    return _kernels


def _tensor_args(
    jac: Tensor,
    rhs: Tensor,
    h0: Tensor | None,
    out: Tensor,
    prev: Tensor | None,
    grad_jac: Tensor | None,
) -> tuple[Tensor, ...]:
    """The six tensors the chunked and look-back kernels take first; an absent one is passed as
    ``out``, which the kernel never reads in its place (its constexpr flag says it is absent)."""
    return (
        jac,
        rhs,
        h0 if h0 is not None else out,
        out,
        prev if prev is not None else out,
        grad_jac if grad_jac is not None else out,
    )


def _pass_flags(
    h0: Tensor | None, reverse: bool, shift: bool, grad_jac: Tensor | None
) -> dict[str, bool]:
    """The constexpr flags of a chunked or look-back pass: which way it runs, whether it is the
    adjoint (``SHIFT``, ``GRAD_JAC``) and whether there is an initial state."""
    return {
        "HAS_H0": h0 is not None,
        "REVERSE": reverse,
        "SHIFT": shift,
        "GRAD_JAC": grad_jac is not None,
    }


def _launch_diag_chunked(
    jac: Tensor,
    rhs: Tensor,
    h0: Tensor | None,
    out: Tensor,
    plan: DiagScanPlan,
    *,
    reverse: bool,
    shift: bool,
    prev: Tensor | None = None,
    grad_jac: Tensor | None = None,
) -> None:
    batch, steps, channels = rhs.shape
    launchable(_kernels().scan_diag_kernel)[(math.ceil(channels / plan.block_d), batch)](
        *_tensor_args(jac, rhs, h0, out, prev, grad_jac),
        steps,
        channels,
        **_pass_flags(h0, reverse, shift, grad_jac),
        BLOCK_T=plan.block_t,
        BLOCK_D=plan.block_d,
        VEC=plan.vec,
        num_warps=plan.num_warps,
    )


def _launch_diag_lookback(
    jac: Tensor,
    rhs: Tensor,
    h0: Tensor | None,
    out: Tensor,
    plan: DiagScanPlan,
    *,
    reverse: bool,
    shift: bool,
    prev: Tensor | None = None,
    grad_jac: Tensor | None = None,
) -> None:
    batch, steps, channels = rhs.shape
    n_cols_d = math.ceil(channels / plan.block_d)
    n_tiles = math.ceil(steps / plan.block_t)
    n_cols = batch * n_cols_d
    dev = rhs.device
    # Published tile monoids (Π a, state from zero) and inclusive states, which need no
    # initialisation; the ticket counter and the tile states (two bits per tile) start at zero.
    # One buffer each, sliced inside the kernels (views cost host time at every call).
    scratch_count = 3 * n_cols * n_tiles * plan.block_d
    flag_count = 1 + n_cols * math.ceil(n_tiles / _TILES_PER_WORD)
    if plan.method == "tiles":
        kernel = _kernels().scan_diag_tiles_kernel
        shape = {"BLOCK_T": plan.block_t}
    elif plan.method == "twopass":
        kernel = _kernels().scan_diag_twopass_kernel
        shape = {"BLOCK_T": plan.block_t, "ROWS": plan.rows, "VEC": plan.vec}
    else:
        kernel = _kernels().scan_diag_lookback_kernel
        shape = {
            "GROUPS": plan.block_t // plan.rows,
            "ROWS": plan.rows,
            "VEC": plan.vec,
            "RESCAN": plan.rescan,
        }

    def run(scratch: Tensor, flags: Tensor, *clear: Tensor | int) -> None:
        launchable(kernel)[(n_tiles * n_cols,)](
            *_tensor_args(jac, rhs, h0, out, prev, grad_jac),
            scratch,
            flags,
            *clear,
            steps,
            channels,
            n_cols_d,
            n_tiles,
            **_pass_flags(h0, reverse, shift, grad_jac),
            BLOCK_D=plan.block_d,
            INCLUSIVE_EVERY=plan.inclusive_every,
            WINDOW=plan.window,
            num_warps=plan.num_warps,
            **shape,
        )

    if plan.method == "tiles":
        # Its own scratch and zeroed flags: the tiles kernel clears nothing (see its docstring).
        run(*_fresh_look_back_buffers(dev, scratch_count, flag_count))
    else:
        _with_look_back_buffers(dev, scratch_count, flag_count, run)


@dataclass
class _LookBackBuffers:
    """One stream's look-back buffers, reused by launch after launch (launches on one stream run
    in order). The scratch needs no initialisation. The flag buffers alternate: a launch takes
    ``flags[turn]``, all zeros, and its programs clear the ``dirty`` words that the launch before
    it left set in the other buffer, which the next launch then takes. So no launch needs a zero
    fill of its own (an allocation and a fill kernel: host time), and no program clears the
    words its own launch still uses (that needs a fence per program: docs/kernels.md)."""

    flags: list[Tensor]
    scratch: Tensor | None = None
    dirty: list[int] = field(default_factory=lambda: [0, 0])
    turn: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


#: Per (device type, device index, stream): the look-back buffers (:class:`_LookBackBuffers`).
_LOOK_BACK_BUFFERS: dict[tuple[str, int | None, int], _LookBackBuffers] = {}


def _current_stream_handle(device: torch.device) -> int:
    # Triton launches on this stream; its raw handle is the cheapest way to name it.
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    index = device.index if device.index is not None else torch.cuda.current_device()
    if raw is not None:
        handle: int = raw(index)
        return handle
    return int(torch.cuda.current_stream(device).cuda_stream)


def _fresh_look_back_buffers(
    device: torch.device, scratch_count: int, flag_count: int
) -> tuple[Tensor, Tensor]:
    """A launch's own look-back scratch (float32, any contents) and flags (int32 zeros)."""
    return (
        torch.empty(scratch_count, device=device, dtype=torch.float32),
        torch.zeros(flag_count, device=device, dtype=torch.int32),
    )


def _with_look_back_buffers(
    device: torch.device,
    scratch_count: int,
    flag_count: int,
    run: Callable[[Tensor, Tensor, Tensor, int], None],
) -> None:
    """``run(scratch, flags, clear, clear_count)`` with at least ``scratch_count`` float32
    elements of scratch and ``flag_count`` int32 zeros of flags, from this stream's buffers
    (:class:`_LookBackBuffers`). While a CUDA graph is being captured or the call is traced, a
    fresh scratch and a fresh ``torch.zeros`` (the graph or the traced program keeps its own),
    and nothing to clear."""
    cuda = device.type == "cuda"
    if not plain_eager() or (cuda and torch.cuda.is_current_stream_capturing()):
        own_scratch, own_flags = _fresh_look_back_buffers(device, scratch_count, flag_count)
        run(own_scratch, own_flags, own_flags, 0)
        return
    # The interpreter runs each launch to its end before the next: one "stream".
    stream = _current_stream_handle(device) if cuda else 0
    key = (device.type, device.index, stream)
    buffers = _LOOK_BACK_BUFFERS.get(key)
    if buffers is None:
        zeros = [torch.zeros(_MIN_FLAG_WORDS, device=device, dtype=torch.int32) for _ in "ab"]
        buffers = _LOOK_BACK_BUFFERS.setdefault(key, _LookBackBuffers(zeros))
    words = -(-flag_count // 16) * 16
    with buffers.lock:
        scratch = buffers.scratch
        if scratch_count > _MAX_KEPT_SCRATCH:
            scratch = torch.empty(scratch_count, device=device, dtype=torch.float32)
        elif scratch is None or scratch.numel() < scratch_count:
            # Launches still reading the old buffer come first on this stream, which is the
            # order in which the caching allocator hands its memory out again.
            size = min(max(scratch_count, 2 * (0 if scratch is None else scratch.numel())),
                       _MAX_KEPT_SCRATCH)  # fmt: skip
            scratch = buffers.scratch = torch.empty(size, device=device, dtype=torch.float32)
        use, other = buffers.turn, 1 - buffers.turn
        if buffers.flags[use].numel() < words:
            size = max(words, 2 * buffers.flags[use].numel())
            buffers.flags[use] = torch.zeros(size, device=device, dtype=torch.int32)
            buffers.dirty[use] = 0
        run(scratch, buffers.flags[use], buffers.flags[other], buffers.dirty[other])
        # Only after a launch: one that raised left both buffers as they were.
        buffers.dirty[other] = 0
        buffers.dirty[use] = words
        buffers.turn = other


def _launch_diag_streamed(
    jac: Tensor,
    rhs: Tensor,
    h0: Tensor | None,
    out: Tensor,
    plan: DiagScanPlan,
    *,
    reverse: bool,
    shift: bool,
    prev: Tensor | None = None,
    grad_jac: Tensor | None = None,
) -> None:
    tensors = (jac, rhs, out)
    if shift or not plain_eager() or any(t.data_ptr() % _TMA_ALIGNMENT for t in tensors):
        # Descriptors are built on the host per call, for real tensors at 16-byte aligned
        # addresses: traced calls (torch.compile, fake tensors) and misaligned views take the
        # shape's plan without the streamed pass instead (the chunked walk alone would leave
        # the GPU idle where B·D is small). The kernel has no shifted (adjoint) pass, which
        # plan_scan_diag never plans streamed; a hand-made plan gets the fallback too, which
        # is never streamed, so this does not come back here.
        batch, _steps, channels = rhs.shape
        fallback = _unstreamed_plan(batch, channels, rhs.device, rhs.dtype, shift)
        _launcher(fallback)(
            jac, rhs, h0, out, fallback, reverse=reverse, shift=shift, prev=prev,
            grad_jac=grad_jac,
        )  # fmt: skip
        return
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor
    except ImportError as err:  # pragma: no cover - every supported Triton has it
        raise RuntimeError(
            "method='streamed' needs triton.tools.tensor_descriptor (host TMA descriptors), "
            "which this Triton does not have"
        ) from err

    block = [1, plan.block_t, plan.block_d]
    batch, steps, channels = rhs.shape
    launchable(_kernels().scan_diag_streamed_kernel)[(math.ceil(channels / plan.block_d), batch)](
        TensorDescriptor.from_tensor(jac, block),
        TensorDescriptor.from_tensor(rhs, block),
        TensorDescriptor.from_tensor(out, block),
        h0 if h0 is not None else out,
        steps,
        channels,
        HAS_H0=h0 is not None,
        REVERSE=reverse,
        BLOCK_T=plan.block_t,
        BLOCK_D=plan.block_d,
        STAGES=plan.stages,
        num_warps=plan.num_warps,
    )


def _launcher(plan: DiagScanPlan) -> Any:
    if plan.method == "chunked":
        return _launch_diag_chunked
    if plan.method == "streamed":
        return _launch_diag_streamed
    return _launch_diag_lookback


def triton_scan_diag(
    jac: Tensor,
    rhs: Tensor,
    h0: Tensor | None,
    *,
    reverse: bool,
    **overrides: Any,
) -> Tensor:
    """Diagonal scan on contiguous ``[B, T, D]`` tensors; returns ``[B, T, D]`` in rhs's dtype.

    h0 ``[B, D]`` or None. ``overrides`` (``method``, ``block_t``, ``block_d``, ``num_warps``,
    ``rows``, ``inclusive_every``, ``window``) replace the launch plan's choices: tests reach
    chunk and tile boundaries with them at small sizes, the benchmark tunes with them.
    """
    batch, steps, channels = rhs.shape
    plan = plan_scan_diag(batch, steps, channels, rhs.device, dtype=rhs.dtype, **overrides)
    out = torch.empty_like(rhs)
    _launcher(plan)(jac, rhs, h0, out, plan, reverse=reverse, shift=False)
    return out


def triton_scan_diag_backward(
    jac: Tensor,
    y: Tensor,
    h0: Tensor | None,
    grad_y: Tensor,
    *,
    reverse: bool,
    **overrides: Any,
) -> tuple[Tensor, Tensor, Tensor]:
    """Adjoint of :func:`triton_scan_diag`: ``(∂L/∂jac, ∂L/∂rhs, ∂L/∂h0)``.

    One fused pass in the other direction reads jac, y and grad_y and writes both ``[B, T, D]``
    gradients (the formula is in
    :func:`pararnn_kernels.scan.reference.reference_scan_diag_backward`). ``∂L/∂h0`` ``[B, D]``
    is returned even when h0 is None (:func:`triton_scan_diag_adjoint` can skip it).
    ``overrides`` as for :func:`triton_scan_diag`.
    """
    grad_jac, grad_rhs = triton_scan_diag_adjoint(jac, y, h0, grad_y, reverse=reverse, **overrides)
    return grad_jac, grad_rhs, _grad_h0(jac, grad_rhs, reverse)


def _grad_h0(jac: Tensor, grad_rhs: Tensor, reverse: bool) -> Tensor:
    # ∂L/∂h0 = a at the first processing position times the adjoint there.
    first = grad_rhs.shape[1] - 1 if reverse else 0
    return (jac[:, first].float() * grad_rhs[:, first].float()).to(grad_rhs.dtype)


def triton_scan_diag_adjoint(
    jac: Tensor,
    y: Tensor,
    h0: Tensor | None,
    grad_y: Tensor,
    *,
    reverse: bool,
    **overrides: Any,
) -> tuple[Tensor, Tensor]:
    """``(∂L/∂jac, ∂L/∂rhs)`` of :func:`triton_scan_diag_backward` without ``∂L/∂h0`` (four
    small tensor ops of host time, spared when there is no h0 to differentiate)."""
    batch, steps, channels = y.shape
    plan = plan_scan_diag(
        batch, steps, channels, y.device, dtype=y.dtype, adjoint=True, **overrides
    )
    grad_rhs = torch.empty_like(y)
    grad_jac = torch.empty_like(jac)
    _launcher(plan)(
        jac, grad_y, h0, grad_rhs, plan, reverse=not reverse, shift=True, prev=y, grad_jac=grad_jac
    )
    return grad_jac, grad_rhs


def _block_plan(channels: int, k: int) -> tuple[int, int]:
    block_d = min(16, triton_next_power_of_2(channels))
    block_t = 16 if k > 2 else 32
    return block_t, block_d


def triton_scan_block_diag(
    jac: Tensor,
    rhs: Tensor,
    h0: Tensor | None,
    *,
    reverse: bool,
    block_t: int | None = None,
    block_d: int | None = None,
) -> Tensor:
    """Block scan on contiguous jac ``[B, T, D, k, k]``, rhs ``[B, T, D, k]``, k <= 4."""
    batch, steps, channels, k = rhs.shape
    default_t, default_d = _block_plan(channels, k)
    block_t, block_d = block_t or default_t, block_d or default_d
    out = torch.empty_like(rhs)
    grid = (math.ceil(channels / block_d), batch)
    launchable(_kernels().scan_block_diag_kernel)[grid](
        jac,
        rhs,
        h0 if h0 is not None else out,
        out,
        out,
        out,
        steps,
        channels,
        K=k,
        HAS_H0=h0 is not None,
        REVERSE=reverse,
        SHIFT=False,
        TRANSPOSE=False,
        GRAD_JAC=False,
        BLOCK_T=block_t,
        BLOCK_D=block_d,
        num_warps=4,
    )
    return out


def triton_scan_block_diag_backward(
    jac: Tensor,
    y: Tensor,
    h0: Tensor | None,
    grad_y: Tensor,
    *,
    reverse: bool,
    block_t: int | None = None,
    block_d: int | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Adjoint of :func:`triton_scan_block_diag`: ``(∂L/∂jac, ∂L/∂rhs, ∂L/∂h0)`` in one pass."""
    batch, steps, channels, k = y.shape
    default_t, default_d = _block_plan(channels, k)
    block_t, block_d = block_t or default_t, block_d or default_d
    grad_rhs = torch.empty_like(y)
    grad_jac = torch.empty_like(jac)
    grid = (math.ceil(channels / block_d), batch)
    launchable(_kernels().scan_block_diag_kernel)[grid](
        jac,
        grad_y,
        h0 if h0 is not None else y,
        grad_rhs,
        y,
        grad_jac,
        steps,
        channels,
        K=k,
        HAS_H0=h0 is not None,
        REVERSE=not reverse,
        SHIFT=True,
        TRANSPOSE=True,
        GRAD_JAC=True,
        BLOCK_T=block_t,
        BLOCK_D=block_d,
        num_warps=4,
    )
    first = steps - 1 if reverse else 0
    a_first = jac[:, first].float().transpose(-1, -2)
    grad_h0 = (a_first @ grad_rhs[:, first].float().unsqueeze(-1)).squeeze(-1).to(y.dtype)
    return grad_jac, grad_rhs, grad_h0
