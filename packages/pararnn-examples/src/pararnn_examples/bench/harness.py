"""Run the benchmark: every cell x shape x dtype x scope x method x direction, one record each.

Order of work per ``(dtype, shape, cell)``: build the layer's cell and its input ``x [B, T, d]``
and output cotangent from the run's seed; for each cell scope build the shared
:class:`~pararnn_examples.bench.CaseInputs`; for each method serving the scope check availability,
build it, run its forward once (a warm-up that also compiles) and compare that output with the
float64 reference (computed once per reference key and scope), then time ``fwd`` and ``fwd_bwd``.
Then the scope ``"scan"``, per ``(dtype, scan shape)``: the shared
:class:`~pararnn_examples.bench.ScanInputs` and the same steps for each method serving it.
Speed-ups are ratios between records of the same cell, scope, shape, dtype and direction.

The check: ``max |out - reference|`` in float64, on the reference's device, one batch entry at a
time (so the largest cases need no second full-size float64 copy), against
``tolerance * max(1, max |reference|)``. A method whose model differs (a :class:`NotComparable`
reference) is checked for its output's shape and finiteness only.

Peers (methods with a :attr:`~pararnn_examples.bench.Method.peer`): the run's first lines and
its environment (``peers``) say which were used, with their versions, and which were skipped and
why (:func:`~pararnn_examples.bench.peers.peer_statuses`).

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
from typing import Any, Final, NamedTuple

import torch
from torch import Tensor

import pararnn_core as pc
import pararnn_kernels

from .cases import (
    CELLS,
    DIRECTIONS,
    DTYPES,
    SCAN_CELL,
    BenchConfig,
    Case,
    CaseInputs,
    ScanInputs,
    Shape,
    make_case_inputs,
    make_scan_inputs,
)
from .measure import (
    Timing,
    copy_bandwidth,
    cuda_graph_replay,
    floor_bytes,
    l2_flush_buffer,
    measure,
    scan_floor_bytes,
)
from .peers.base import PeerStatus, peer_statuses
from .registry import Method, NotComparable, Reference, Runner, get_method

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
#: The inputs of one case: a cell scope's or the scope "scan"'s.
Inputs = CaseInputs | ScanInputs
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
        host_ms: median host (CPU) time of the timed calls, until the call returned (close to
            ``median_ms``: the device waited for the host).
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
    host_ms: float | None = None
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


class _Comparison(NamedTuple):
    max_err: float
    finite: bool
    max_ref: float


def _compare(actual: Tensor, expected: Tensor) -> _Comparison:
    """``max |actual - expected|``, whether ``actual`` is finite and ``max |expected|``, in
    float64 on ``expected``'s device, one index of the leading dimension at a time."""
    max_err, finite, max_ref = 0.0, True, 0.0
    rows = actual.shape[0] if actual.dim() else 1
    for i in range(rows):
        a = (actual[i] if actual.dim() else actual).to(expected.device, torch.float64)
        e = (expected[i] if expected.dim() else expected).to(torch.float64)
        if not a.numel():
            continue
        max_ref = max(max_ref, float(e.abs().max()))
        if not bool(torch.isfinite(a).all()):
            finite = False
            continue
        max_err = max(max_err, float((a - e).abs().max()))
    return _Comparison(max_err, finite, max_ref)


def _check_not_comparable(out: Tensor, ref: NotComparable) -> _Check:
    shape = tuple(out.shape)
    if shape != tuple(ref.shape):
        return _Check(err_ok=False, reference=ref.kind, note=f"output shape {shape} != {ref.shape}")
    if not bool(torch.isfinite(out.detach()).all()):
        return _Check(err_ok=False, reference=ref.kind, note="non-finite forward output")
    note = f"output finite, shape {list(shape)}"
    return _Check(reference=ref.kind, note=f"{ref.note}; {note}" if ref.note else note)


def _check(
    out: Tensor,
    runner: Runner,
    references: dict[str, Reference | NotComparable | str],
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
    actual = runner.to_reference_layout(out.detach())
    if isinstance(ref, NotComparable):
        return _check_not_comparable(actual, ref)
    expected = ref.value.detach()
    if tuple(actual.shape) != tuple(expected.shape):
        return _Check(
            err_ok=False,
            reference=ref.kind,
            note=f"output shape {tuple(actual.shape)} != reference {tuple(expected.shape)}",
        )
    rel = runner.tolerance if runner.tolerance is not None else TOLERANCES[case.dtype]
    found = _compare(actual, expected)
    tol = rel * max(1.0, found.max_ref)
    if not found.finite:
        return _Check(math.inf, tol, False, ref.kind, "non-finite forward output")
    return _Check(found.max_err, tol, found.max_err <= tol, ref.kind)


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
    record.host_ms = timing.median_host_ms
    record.floor_bytes = floor
    record.floor_ms = floor / bandwidth * 1e3
    record.pct_of_floor = 100.0 * record.floor_ms / record.median_ms if record.median_ms else None
    record.peak_bytes = timing.peak_bytes
    record.peak_above_start_bytes = timing.peak_above_start_bytes
    if record.repeats == 1 and config.repeats > 1:
        record.note = (record.note + "; " if record.note else "") + (
            f"timed once (slower than {config.slow_ms:g} ms)"
        )


def _floor_bytes(case: Case, inputs: Inputs, direction: str) -> int:
    batch, steps, width = case.shape
    if isinstance(inputs, ScanInputs):
        return scan_floor_bytes(batch, steps, width, case.torch_dtype, direction)
    return floor_bytes(inputs.cell, batch, steps, case.torch_dtype, direction)


def _run_method(
    method: Method[Any],
    case: Case,
    inputs: Inputs,
    config: BenchConfig,
    references: dict[str, Reference | NotComparable | str],
    bandwidth: float,
    flush: Tensor | None,
) -> list[BenchRecord]:
    records = [_base(case, method.name, d) for d in DIRECTIONS]
    floors = {d: _floor_bytes(case, inputs, d) for d in DIRECTIONS}
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
    note = "; ".join(n for n in (runner.note, check.note) if n)
    for record in records:
        record.max_err, record.err_tol, record.err_ok = check.max_err, check.err_tol, check.err_ok
        record.reference, record.note = check.reference, note
        if stats is not None:
            record.newton_iters = stats.iters
            record.newton_residual = stats.max_residual
            record.scan_backend = stats.backend
        fn, first = calls[record.direction]
        try:
            if config.cuda_graphs:
                fn, first = _graphed(fn, case, config, record)
            timing = measure(
                fn,
                case.device,
                warmup=config.warmup,
                repeats=config.repeats,
                slow_ms=config.slow_ms,
                flush=flush,
                first_ms=first,
                first_is_warm=not runner.compiles,
            )
        except Exception as err:
            record.status, record.skipped_reason = _failure(err, config)
        else:
            _timed(record, timing, floors[record.direction], bandwidth, config)
    return records


def _graphed(
    fn: Callable[[], object], case: Case, config: BenchConfig, record: BenchRecord
) -> tuple[Callable[[], object], float | None]:
    """``fn`` as the replay of its CUDA graph (``config.cuda_graphs``), or ``fn`` itself when
    the capture fails; the record's note says which. The replay compiles nothing, so the
    measured warm-up call is not reused."""
    try:
        replay = cuda_graph_replay(fn, case.device)
    except Exception as err:
        if config.fail_fast:
            raise
        torch.cuda.synchronize(case.device)
        why = (
            f"not captured in a CUDA graph ({type(err).__name__}: {_one_line(err)}): ordinary calls"
        )
        record.note = (record.note + "; " if record.note else "") + why
        return fn, None
    record.note = (record.note + "; " if record.note else "") + "CUDA graph replays"
    return replay, None


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


def environment(
    config: BenchConfig, copy_bytes_per_s: float, peers: list[PeerStatus] | None = None
) -> dict[str, Any]:
    """Date, versions (ours and the peers'), device and the measured copy bandwidth: what a table
    needs beside it."""
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
        "newton_stats": config.newton_stats,
        "cuda_graphs": config.cuda_graphs,
        "projection": config.projection,
        "argv": sys.argv,
        "peers": [p.as_dict() for p in peers or []],
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


def _cell_cases(config: BenchConfig) -> Iterator[tuple[str, Shape, str]]:
    for dtype in config.dtypes:
        for shape in config.shapes:
            for cell in config.cells:
                yield dtype, shape, cell


def _clear_grads(inputs: Inputs) -> None:
    if isinstance(inputs, ScanInputs):
        inputs.jac.grad = None
        inputs.rhs.grad = None
        return
    inputs.inputs.grad = None
    for p in inputs.cell.parameters():
        p.grad = None


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
        The :class:`BenchResult`: two records (``fwd``, ``fwd_bwd``) per case (cell, shape,
        dtype and cell scope, or scan shape and dtype in scope ``"scan"``) and method serving its
        scope, with speed-ups filled in.
    """
    device = config.torch_device
    methods = [get_method(name) for name in config.methods]
    by_scope = {s: [m for m in methods if s in m.scopes] for s in config.scopes}
    cell_scopes = [s for s in config.scopes if s != "scan"]
    copy_bytes = config.copy_bytes or _DEFAULT_COPY_BYTES[device.type]
    bandwidth = copy_bandwidth(device, copy_bytes)
    _release(device)
    peers = peer_statuses([m for m in methods if set(m.scopes) & set(config.scopes)], device)
    env = environment(config, bandwidth, peers)
    flush = l2_flush_buffer(device)
    units = len(config.dtypes) * len(config.shapes) * len(config.cells)
    total = units * sum(len(by_scope[s]) for s in cell_scopes)
    if "scan" in by_scope:
        total += len(config.dtypes) * len(config.scan_shapes) * len(by_scope["scan"])
    bar = _Progress(total, progress)
    where = env.get("gpu", config.device)
    bar.write(f"pararnn-bench on {where}: copy bandwidth {bandwidth / 1e9:.0f} GB/s")
    for status in peers:
        bar.write(status.line())
    records: list[BenchRecord] = []

    def run_case(case: Case, inputs: Inputs) -> None:
        references: dict[str, Reference | NotComparable | str] = {}
        for method in by_scope[case.scope]:
            bar.describe(f"{case.cell} {case.scope} {case.shape} {method.name}")
            done = _run_method(method, case, inputs, config, references, bandwidth, flush)
            for record in done:
                records.append(record)
                bar.write(progress_line(record))
                if on_record is not None:
                    on_record(record)
            if any(r.status != "ok" for r in done):
                # The exception's frames held the failed call's tensors until now.
                _release(device)
            _clear_grads(inputs)
            bar.advance()

    try:
        if cell_scopes:
            for dtype, shape, cell_name in _cell_cases(config):
                torch.manual_seed(config.seed)
                batch, steps, width = shape
                storage = DTYPES[dtype]
                # Parameters and inputs are drawn in fp32 and rounded, so every dtype of one run
                # gets the same problem up to storage precision.
                layer_cell = CELLS[cell_name](width, width, device=device).to(dtype=storage)
                projection = getattr(layer_cell, "proj", None)
                if isinstance(projection, pc.ProjectionLinear):
                    projection.backend = config.projection
                x = torch.randn(batch, steps, width, device=device).to(storage)
                grad_y = torch.randn(batch, steps, width, device=device).to(storage)
                for scope in cell_scopes:
                    case = Case(cell_name, shape, dtype, scope, device)
                    torch.manual_seed(config.seed + 1)
                    run_case(case, make_case_inputs(case, layer_cell, x, grad_y))
                    _release(device)
                del layer_cell, x, grad_y
                _release(device)
        if "scan" in by_scope:
            for dtype in config.dtypes:
                for shape in config.scan_shapes:
                    case = Case(SCAN_CELL, shape, dtype, "scan", device)
                    torch.manual_seed(config.seed)
                    run_case(case, make_scan_inputs(case))
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
