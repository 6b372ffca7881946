"""Timing, peak memory, copy bandwidth and the HBM floor model.

Timing: on CUDA each call is bracketed by CUDA events after the L2 cache was overwritten (a
256 MiB ``zero_`` outside the events, as ``triton.testing.do_bench`` does), so a case never
reads its inputs from the cache the previous call left warm; on the CPU ``time.perf_counter``
around the call. The first call of every case is a warm-up (it compiles Triton kernels).

Floor (``docs/benchmarks.md``, "pararnn-bench"): the bytes a perfect kernel must move, over the
device-to-device copy bandwidth measured in the same run (bytes read plus bytes written):

* ``fwd``: read ``u [B, T, d_u]`` once, write the states ``[B, T, *S]`` once;
* ``fwd_bwd``: that, plus the backward: read the states, ``u`` and ``∂L/∂states``, write
  ``∂L/∂u`` -- ``3 (d_u + |S|) B T`` elements in all.

Scope ``"scan"`` (:func:`scan_floor_bytes`, ``N = B T D`` elements per tensor), the same count for
every method:

* ``fwd``: read ``jac`` and ``rhs``, write ``y`` -- ``3 N``;
* ``fwd_bwd``: that, plus the backward: read ``jac``, ``y`` and ``∂L/∂y``, write ``∂L/∂jac`` and
  ``∂L/∂rhs`` -- ``8 N`` in all. (The adjoint is the reverse scan ``μ_t = ∂L/∂y_t +
  jac_{t+1} μ_{t+1}``, ``∂L/∂rhs = μ``, ``∂L/∂jac_t = μ_t y_{t-1}``.)
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import torch
from torch import Tensor

import pararnn_core as pc

__all__ = [
    "TF32_MODES",
    "Timing",
    "copy_bandwidth",
    "cuda_graph_replay",
    "floor_bytes",
    "l2_flush_buffer",
    "measure",
    "scan_floor_bytes",
    "set_tf32",
    "time_call_ms",
]

#: Larger than the L2 cache of any current GPU (H200: 50 MiB).
L2_FLUSH_BYTES: Final = 256 * 2**20
#: ``--tf32`` choices: PyTorch's own settings, or every fp32 multiply in fp32 / in TF32.
TF32_MODES: Final = ("default", "off", "on")


def set_tf32(mode: str) -> None:
    """Apply a :data:`TF32_MODES` choice to the process: ``"default"`` leaves PyTorch's settings
    (``torch.backends.cudnn.allow_tf32`` on, ``torch.backends.cuda.matmul.allow_tf32`` off), so
    cuDNN's fp32 RNNs multiply in TF32 and the input projections in fp32; ``"off"`` and
    ``"on"`` set both, so every method multiplies alike.

    Raises:
        ValueError: ``mode`` is not one of :data:`TF32_MODES`.
    """
    if mode not in TF32_MODES:
        raise ValueError(f"tf32 mode must be one of {TF32_MODES}, got {mode!r}")
    if mode != "default":
        torch.backends.cuda.matmul.allow_tf32 = mode == "on"
        torch.backends.cudnn.allow_tf32 = mode == "on"


@dataclass(frozen=True)
class Timing:
    """What :func:`measure` found.

    Attributes:
        times_ms: every timed call, in milliseconds.
        peak_bytes: ``torch.cuda.max_memory_allocated`` over the timed calls, after a reset
            (None on the CPU).
        peak_above_start_bytes: ``peak_bytes`` minus what was allocated when the timed calls
            began (inputs and parameters shared by every method), None on the CPU.
        host_ms: the host (CPU) time of each timed call, until ``fn`` returned: where it is
            close to ``times_ms``, the device waited for the host.
    """

    times_ms: tuple[float, ...]
    peak_bytes: int | None
    peak_above_start_bytes: int | None
    host_ms: tuple[float, ...] = ()

    @property
    def median_host_ms(self) -> float | None:
        return float(statistics.median(self.host_ms)) if self.host_ms else None

    @property
    def median_ms(self) -> float:
        return float(statistics.median(self.times_ms))

    @property
    def min_ms(self) -> float:
        return min(self.times_ms)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def l2_flush_buffer(device: torch.device) -> Tensor | None:
    """A buffer whose ``zero_()`` evicts the L2 cache (CUDA), or None (CPU)."""
    if device.type != "cuda":
        return None
    return torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.float32, device=device)


def time_call_ms(
    fn: Callable[[], object], device: torch.device, flush: Tensor | None = None
) -> float:
    """Milliseconds of one call of ``fn`` (CUDA events on CUDA, perf_counter on the CPU)."""
    if device.type == "cuda":
        if flush is not None:
            flush.zero_()
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        fn()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end))
    begin = time.perf_counter()
    fn()
    return (time.perf_counter() - begin) * 1e3


def cuda_graph_replay(fn: Callable[[], object], device: torch.device) -> Callable[[], None]:
    """``fn`` captured in a CUDA graph: two warm-up calls on a side stream (as
    ``torch.cuda.graphs`` asks), one captured call; returns the graph's ``replay``, which
    repeats the captured work on the tensors the capture used (its own memory pool).

    Raises:
        RuntimeError: ``fn`` did something a graph cannot hold (waited for the device,
            copied to the host, ...): the error of the failed capture.
    """
    side = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def _wall_ms(fn: Callable[[], object], device: torch.device) -> float:
    _sync(device)
    begin = time.perf_counter()
    fn()
    _sync(device)
    return (time.perf_counter() - begin) * 1e3


def measure(
    fn: Callable[[], object],
    device: torch.device,
    *,
    warmup: int,
    repeats: int,
    slow_ms: float,
    flush: Tensor | None = None,
    first_ms: float | None = None,
    first_is_warm: bool = False,
) -> Timing:
    """Time ``fn``: warm-up calls, then ``repeats`` timed calls (fewer when it is slow).

    The first call is a warm-up whose wall time is taken (``first_ms``, if the caller made that
    call already). When it is slower than ``slow_ms`` no more warm-up runs; one call is timed,
    and only if that one is faster than ``slow_ms`` (the first was compiling) do the other
    ``repeats - 1`` follow. Peak memory is tracked over the timed calls.

    With ``first_is_warm`` (``fn`` compiles nothing) and no ``first_ms``, a first call slower
    than ``slow_ms`` is the one timed call: its wall time, synchronized before and after (over
    ``slow_ms`` the difference from CUDA events is noise), and the peak memory during it.

    Args:
        fn: the call to time.
        device: where it runs.
        warmup: warm-up calls, the first included (``>= 1``).
        repeats: timed calls for a fast case.
        slow_ms: the threshold above.
        flush: an :func:`l2_flush_buffer`, zeroed before each timed call.
        first_ms: wall time of a first call the caller already made.
        first_is_warm: ``fn`` compiles nothing, so a slow first call may be the timed one.
    """
    cuda = device.type == "cuda"

    def reset_peak() -> int:
        if not cuda:
            return 0
        _sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        return torch.cuda.memory_allocated(device)

    host: list[float] = []

    def hosted() -> None:
        begin = time.perf_counter()
        fn()
        host.append((time.perf_counter() - begin) * 1e3)

    def timing(times: list[float], start_bytes: int) -> Timing:
        if not cuda:
            return Timing(tuple(times), None, None, tuple(host))
        peak = torch.cuda.max_memory_allocated(device)
        return Timing(tuple(times), peak, peak - start_bytes, tuple(host))

    if first_ms is None:
        start_bytes = reset_peak()
        first = _wall_ms(hosted, device)
        if first_is_warm and first > slow_ms:
            return timing([first], start_bytes)
        host.clear()
    else:
        first = first_ms
    if first <= slow_ms:
        for _ in range(warmup - 1):
            fn()
    start_bytes = reset_peak()
    times = [time_call_ms(hosted, device, flush)]
    if times[0] <= slow_ms:
        times += [time_call_ms(hosted, device, flush) for _ in range(repeats - 1)]
    return timing(times, start_bytes)


def copy_bandwidth(device: torch.device, nbytes: int, *, repeats: int = 10) -> float:
    """Bytes per second of ``dst.copy_(src)`` for an ``nbytes`` buffer, counting bytes read
    plus bytes written (the median of ``repeats`` timed copies after warm-up)."""
    src = torch.randn(max(nbytes // 4, 1), dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    timing = measure(
        lambda: dst.copy_(src), device, warmup=3, repeats=repeats, slow_ms=float("inf")
    )
    moved = 2 * src.numel() * src.element_size()
    return moved / (timing.median_ms * 1e-3)


def floor_bytes(
    cell: pc.ParaCell, batch: int, steps: int, dtype: torch.dtype, direction: str
) -> int:
    """Bytes the floor model moves for ``cell`` at ``[B, T]`` (module docstring).

    Args:
        cell: gives ``d_u`` and the state shape ``S``.
        batch, steps: ``B``, ``T``.
        dtype: the storage dtype (its element size).
        direction: ``"fwd"`` or ``"fwd_bwd"``.
    """
    state = 1
    for n in cell.state_shape:
        state *= n
    per_step = cell.d_u + state
    if direction == "fwd_bwd":
        per_step *= 3
    elif direction != "fwd":
        raise ValueError(f"direction must be 'fwd' or 'fwd_bwd', got {direction!r}")
    element = dtype.itemsize
    return batch * steps * per_step * element


#: Tensors of ``B T D`` elements the scan floor moves, per direction (module docstring).
_SCAN_FLOOR_TENSORS: Final[dict[str, int]] = {"fwd": 3, "fwd_bwd": 8}


def scan_floor_bytes(batch: int, steps: int, width: int, dtype: torch.dtype, direction: str) -> int:
    """Bytes the floor model moves for the linear scan of ``[B, T, D]`` (module docstring).

    Args:
        batch, steps, width: ``B``, ``T``, ``D``.
        dtype: the storage dtype (its element size).
        direction: ``"fwd"`` (``3 B T D`` elements) or ``"fwd_bwd"`` (``8 B T D``).
    """
    if direction not in _SCAN_FLOOR_TENSORS:
        raise ValueError(f"direction must be 'fwd' or 'fwd_bwd', got {direction!r}")
    element = dtype.itemsize
    return _SCAN_FLOOR_TENSORS[direction] * batch * steps * width * element
