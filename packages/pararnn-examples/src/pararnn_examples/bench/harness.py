"""Run the benchmark: every cell x shape x dtype x scope x method x direction, one record each.

Order of work per ``(dtype, shape, cell)``: build the layer's cell and its input ``x [B, T, d]``
and output cotangent from the run's seed; for each scope build the shared
:class:`~pararnn_examples.bench.CaseInputs`; for each method check availability, build it, run its
forward once (a warm-up that also compiles) and compare that output with the float64 reference
(computed once per reference key and scope, kept on the CPU), then time ``fwd`` and ``fwd_bwd``.
Speed-ups are ratios between records of the same cell, scope, shape, dtype and direction.

What is recorded instead of raised: NotImplementedError (e.g. ``scan_backend="fused"`` before
the fused kernels exist), out-of-memory and cuDNN refusals (e.g. ``CUDNN_STATUS_NOT_SUPPORTED``
at very long T) as ``status="skipped"`` with the message as reason; any other exception as
``status="error"`` (or re-raised with ``fail_fast``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import gc
import importlib
import importlib.metadata
import math
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import torch
from torch import Tensor

import pararnn_core as pc
import pararnn_kernels

from .cases import (
    CELLS,
    DIRECTIONS,
    DTYPES,
    BenchConfig,
    Case,
    CaseInputs,
    Shape,
    make_case_inputs,
)
from .measure import Timing, copy_bandwidth, floor_bytes, l2_flush_buffer, measure
from .registry import Method, Reference, Runner, get_method

__all__ = [
    "TOLERANCES",
    "BenchRecord",
    "BenchResult",
    "config_as_dict",
    "environment",
    "run_bench",
]

#: Relative tolerance of the correctness check per storage dtype:
#: ``max_err <= tolerance * max(1, max |reference|)``.
TOLERANCES: Final[dict[str, float]] = {"fp32": 1e-4, "fp16": 1e-2, "bf16": 6e-2}
_DEFAULT_COPY_BYTES: Final[dict[str, int]] = {"cuda": 2**32, "cpu": 2**26}
_REASON_CHARS: Final = 300


@dataclass
class BenchRecord:
    """One cell / scope / method / shape / dtype / direction (the CSV and JSON columns).

    Attributes:
        cell, scope, method, direction, batch, steps, width, dtype, device: the case.
        status: ``"ok"`` (timed), ``"skipped"`` (unavailable, not implemented, out of memory,
            refused by cuDNN) or ``"error"`` (anything else went wrong).
        skipped_reason: why it was not timed ("" when ok).
        median_ms, min_ms: over the timed calls; repeats: how many.
        floor_bytes, floor_ms: the HBM floor model and its time at the run's copy bandwidth.
        pct_of_floor: ``100 * floor_ms / median_ms``.
        peak_bytes, peak_above_start_bytes: CUDA peak memory over the timed calls, absolute and
            above what was allocated before them (None on the CPU).
        max_err: ``max |forward output - float64 reference|``; err_tol its bound; err_ok whether
            it holds (None when not checked).
        reference: how the reference was computed.
        newton_iters, newton_residual, scan_backend: from ``NewtonStats`` (Newton methods).
        note: anything else worth knowing (e.g. timed once because slow).
        speedups: ``{other method: other median_ms / this median_ms}`` for every other method
            timed for the same cell, scope, shape, dtype and direction (> 1: this one is faster).
    """

    cell: str
    scope: str
    method: str
    direction: str
    batch: int
    steps: int
    width: int
    dtype: str
    device: str
    status: str = "ok"
    skipped_reason: str = ""
    median_ms: float | None = None
    min_ms: float | None = None
    repeats: int = 0
    floor_bytes: int | None = None
    floor_ms: float | None = None
    pct_of_floor: float | None = None
    peak_bytes: int | None = None
    peak_above_start_bytes: int | None = None
    max_err: float | None = None
    err_tol: float | None = None
    err_ok: bool | None = None
    reference: str = ""
    newton_iters: int | None = None
    newton_residual: float | None = None
    scan_backend: str = ""
    note: str = ""
    speedups: dict[str, float] = field(default_factory=dict)

    def group_key(self) -> tuple[object, ...]:
        """Records with equal keys are timed on the same problem and compared."""
        return (self.cell, self.scope, self.batch, self.steps, self.width, self.dtype,
                self.direction)  # fmt: skip


@dataclass
class BenchResult:
    """The records of one run and the environment they were measured in."""

    config: BenchConfig
    environment: dict[str, Any]
    records: list[BenchRecord]


@dataclass(frozen=True)
class _Check:
    max_err: float | None = None
    err_tol: float | None = None
    err_ok: bool | None = None
    reference: str = ""
    note: str = ""


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text[:_REASON_CHARS] if text else type(err).__name__


def _release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _failure(err: Exception, config: BenchConfig) -> tuple[str, str]:
    """``(status, reason)`` for an exception raised by a method (see the module docstring)."""
    if isinstance(err, torch.cuda.OutOfMemoryError):
        _release(config.torch_device)
        return "skipped", f"out of memory: {_one_line(err)}"
    if isinstance(err, NotImplementedError):
        return "skipped", _one_line(err)
    if isinstance(err, RuntimeError) and "cudnn" in str(err).lower():
        _release(config.torch_device)
        return "skipped", f"cuDNN refused: {_one_line(err)}"
    if config.fail_fast:
        raise err
    return "error", f"{type(err).__name__}: {_one_line(err)}"


def _check(
    out: Tensor,
    runner: Runner,
    references: dict[str, Reference | str],
    case: Case,
    config: BenchConfig,
) -> _Check:
    key = runner.reference_key
    if key not in references:
        try:
            references[key] = runner.reference()
        except Exception as err:
            if config.fail_fast:
                raise
            _release(case.device)
            references[key] = f"{type(err).__name__}: {_one_line(err)}"
    ref = references[key]
    if isinstance(ref, str):
        return _Check(note=f"not checked, the reference failed: {ref}")
    expected = ref.value.detach().to("cpu", torch.float64)
    actual = out.detach().to("cpu", torch.float64)
    if tuple(actual.shape) != tuple(expected.shape):
        return _Check(
            err_ok=False,
            reference=ref.kind,
            note=f"output shape {tuple(actual.shape)} != reference {tuple(expected.shape)}",
        )
    rel = runner.tolerance if runner.tolerance is not None else TOLERANCES[case.dtype]
    scale = max(1.0, float(expected.abs().max())) if expected.numel() else 1.0
    tol = rel * scale
    if not bool(torch.isfinite(actual).all()):
        return _Check(math.inf, tol, False, ref.kind, "non-finite forward output")
    max_err = float((actual - expected).abs().max()) if actual.numel() else 0.0
    return _Check(max_err, tol, max_err <= tol, ref.kind)


def _base(case: Case, method: str, direction: str) -> BenchRecord:
    return BenchRecord(
        cell=case.cell,
        scope=case.scope,
        method=method,
        direction=direction,
        batch=case.shape.batch,
        steps=case.shape.steps,
        width=case.shape.width,
        dtype=case.dtype,
        device=case.device.type,
    )


def _timed(
    record: BenchRecord, timing: Timing, floor: int, bandwidth: float, config: BenchConfig
) -> None:
    record.median_ms = timing.median_ms
    record.min_ms = timing.min_ms
    record.repeats = len(timing.times_ms)
    record.floor_bytes = floor
    record.floor_ms = floor / bandwidth * 1e3
    record.pct_of_floor = 100.0 * record.floor_ms / record.median_ms if record.median_ms else None
    record.peak_bytes = timing.peak_bytes
    record.peak_above_start_bytes = timing.peak_above_start_bytes
    if record.repeats == 1 and config.repeats > 1:
        record.note = (record.note + "; " if record.note else "") + (
            f"timed once (slower than {config.slow_ms:g} ms)"
        )


def _run_method(
    method: Method,
    case: Case,
    inputs: CaseInputs,
    config: BenchConfig,
    references: dict[str, Reference | str],
    bandwidth: float,
    flush: Tensor | None,
) -> list[BenchRecord]:
    records = [_base(case, method.name, d) for d in DIRECTIONS]
    floors = {
        d: floor_bytes(inputs.cell, case.shape.batch, case.shape.steps, case.torch_dtype, d)
        for d in DIRECTIONS
    }
    for record in records:
        record.floor_bytes = floors[record.direction]
        record.floor_ms = floors[record.direction] / bandwidth * 1e3

    def skip_all(status: str, reason: str) -> list[BenchRecord]:
        for record in records:
            record.status, record.skipped_reason = status, reason
        return records

    reason = method.available(case, config)
    if reason is not None:
        return skip_all("skipped", reason)
    try:
        runner = method.build(case, inputs, config)
        begin = time.perf_counter()
        out = runner.forward()
        if case.device.type == "cuda":
            torch.cuda.synchronize(case.device)
        first_ms = (time.perf_counter() - begin) * 1e3
    except Exception as err:
        return skip_all(*_failure(err, config))
    check = _check(out, runner, references, case, config)
    del out
    stats = runner.stats()
    calls: dict[str, tuple[Callable[[], object], float | None]] = {
        "fwd": (runner.forward, first_ms),
        "fwd_bwd": (runner.forward_backward, None),
    }
    for record in records:
        record.max_err, record.err_tol, record.err_ok = check.max_err, check.err_tol, check.err_ok
        record.reference, record.note = check.reference, check.note
        if stats is not None:
            record.newton_iters = stats.iters
            record.newton_residual = stats.max_residual
            record.scan_backend = stats.backend
        fn, first = calls[record.direction]
        try:
            timing = measure(
                fn,
                case.device,
                warmup=config.warmup,
                repeats=config.repeats,
                slow_ms=config.slow_ms,
                flush=flush,
                first_ms=first,
            )
        except Exception as err:
            record.status, record.skipped_reason = _failure(err, config)
        else:
            _timed(record, timing, floors[record.direction], bandwidth, config)
    return records


def _add_speedups(records: list[BenchRecord]) -> None:
    groups: dict[tuple[object, ...], list[BenchRecord]] = {}
    for record in records:
        if record.status == "ok" and record.median_ms:
            groups.setdefault(record.group_key(), []).append(record)
    for group in groups.values():
        for record in group:
            assert record.median_ms is not None
            record.speedups = {
                other.method: other.median_ms / record.median_ms
                for other in group
                if other is not record and other.median_ms is not None
            }


def _git_commit() -> str | None:
    try:
        found = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if found.returncode != 0:
        return None
    return found.stdout.strip() or None


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment(config: BenchConfig, copy_bytes_per_s: float) -> dict[str, Any]:
    """Date, versions, device and the measured copy bandwidth: what a table needs beside it."""
    env: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "triton": _version("triton"),
        "pararnn_kernels": pararnn_kernels.__version__,
        "pararnn_core": pc.__version__,
        "git_commit": _git_commit(),
        "device": config.device,
        "copy_bandwidth_GBps": copy_bytes_per_s / 1e9,
        "cuda_matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
        "argv": sys.argv,
    }
    if config.device == "cuda":
        props = torch.cuda.get_device_properties(config.torch_device)
        env["gpu"] = props.name
        env["gpu_memory_GiB"] = round(props.total_memory / 2**30, 1)
        env["sm_count"] = props.multi_processor_count
        env["cuda"] = torch.version.cuda
        env["cudnn"] = torch.backends.cudnn.version()  # type: ignore[no-untyped-call]
    return env


class _Progress:
    """A tqdm bar over the cases when tqdm imports, plain lines otherwise."""

    def __init__(self, total: int, enabled: bool) -> None:
        self._bar: Any = None
        self._done = 0
        self._total = total
        self._enabled = enabled
        if enabled:
            try:
                tqdm = importlib.import_module("tqdm")
            except ImportError:
                return
            self._bar = tqdm.tqdm(total=total, unit="case", dynamic_ncols=True)

    def describe(self, text: str) -> None:
        if self._bar is not None:
            self._bar.set_description_str(text)

    def write(self, line: str) -> None:
        if not self._enabled:
            return
        if self._bar is not None:
            self._bar.write(line)
        else:
            print(line, flush=True)

    def advance(self) -> None:
        self._done += 1
        if self._bar is not None:
            self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def progress_line(record: BenchRecord) -> str:
    """One readable line for a record (the progress output)."""
    head = (
        f"{record.cell:9s} {record.scope:10s} {record.dtype} "
        f"B={record.batch} T={record.steps} d={record.width} {record.method:16s} "
        f"{record.direction:7s}"
    )
    if record.status != "ok":
        return f"{head} {record.status}: {record.skipped_reason}"
    err = "" if record.max_err is None else f" err {record.max_err:.1e}"
    flag = " MISMATCH" if record.err_ok is False else ""
    return f"{head} {record.median_ms:10.3f} ms (n={record.repeats}){err}{flag}"


def _cases(config: BenchConfig) -> Iterator[tuple[str, Shape, str]]:
    for dtype in config.dtypes:
        for shape in config.shapes:
            for cell in config.cells:
                yield dtype, shape, cell


def run_bench(
    config: BenchConfig,
    *,
    progress: bool = True,
    on_record: Callable[[BenchRecord], None] | None = None,
) -> BenchResult:
    """Time every case of ``config`` (module docstring) and return the records.

    Args:
        config: what to run.
        progress: show a progress bar (tqdm, when it imports) and one line per record.
        on_record: called with each record as soon as it exists (before speed-ups are filled
            in), e.g. to save it, so a run that is killed half-way loses nothing it measured.

    Returns:
        The :class:`BenchResult`: two records (``fwd``, ``fwd_bwd``) per cell, shape, dtype,
        scope and method, with speed-ups filled in.
    """
    device = config.torch_device
    methods = [get_method(name) for name in config.methods]
    copy_bytes = config.copy_bytes or _DEFAULT_COPY_BYTES[device.type]
    bandwidth = copy_bandwidth(device, copy_bytes)
    _release(device)
    env = environment(config, bandwidth)
    flush = l2_flush_buffer(device)
    units = len(config.dtypes) * len(config.shapes) * len(config.cells)
    bar = _Progress(units * len(config.scopes) * len(methods), progress)
    where = env.get("gpu", config.device)
    bar.write(f"pararnn-bench on {where}: copy bandwidth {bandwidth / 1e9:.0f} GB/s")
    records: list[BenchRecord] = []
    try:
        for dtype, shape, cell_name in _cases(config):
            torch.manual_seed(config.seed)
            batch, steps, width = shape
            storage = DTYPES[dtype]
            # Parameters and inputs are drawn in fp32 and rounded, so every dtype of one run
            # gets the same problem up to storage precision.
            layer_cell = CELLS[cell_name](width, width, device=device).to(dtype=storage)
            x = torch.randn(batch, steps, width, device=device).to(storage)
            grad_y = torch.randn(batch, steps, width, device=device).to(storage)
            for scope in config.scopes:
                case = Case(cell_name, shape, dtype, scope, device)
                torch.manual_seed(config.seed + 1)
                inputs = make_case_inputs(case, layer_cell, x, grad_y)
                references: dict[str, Reference | str] = {}
                for method in methods:
                    bar.describe(f"{cell_name} {scope} {shape} {method.name}")
                    done = _run_method(method, case, inputs, config, references, bandwidth, flush)
                    for record in done:
                        records.append(record)
                        bar.write(progress_line(record))
                        if on_record is not None:
                            on_record(record)
                    if any(r.status != "ok" for r in done):
                        # The exception's frames held the failed call's tensors until now.
                        _release(device)
                    inputs.inputs.grad = None
                    for p in inputs.cell.parameters():
                        p.grad = None
                    bar.advance()
                del inputs, references
                _release(device)
            del layer_cell, x, grad_y
            _release(device)
    finally:
        bar.close()
    _add_speedups(records)
    return BenchResult(config=config, environment=env, records=records)


def config_as_dict(config: BenchConfig) -> dict[str, Any]:
    """``config`` as JSON-ready values (shapes as ``[B, T, d]`` lists)."""
    out = dataclasses.asdict(config)
    out["shapes"] = [list(s) for s in config.shapes]
    return out
