"""pararnn-bench on the CPU at tiny sizes: records, checks, files, the method registry, the CLI."""

from __future__ import annotations

import csv
import json
import runpy
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import pararnn_core as pc
from pararnn_examples.bench import (
    CELL_SCOPES,
    CELLS,
    CSV_NAME,
    DIRECTIONS,
    JSON_NAME,
    PLOT_NAME,
    RECORD_COLUMNS,
    SCOPES,
    BenchConfig,
    BenchResult,
    Method,
    Reference,
    Runner,
    Shape,
    floor_bytes,
    format_table,
    get_method,
    method_names,
    parse_shape,
    register_method,
    run_bench,
    unregister_method,
    write_results,
)
from pararnn_examples.bench.cli import main
from pararnn_examples.bench.measure import set_tf32
from pararnn_kernels.dispatch import triton_interpret_mode

SHAPES = (Shape(1, 8, 4), Shape(1, 16, 4))  # one sequence: half the interpreter's programs
BUILTIN = (
    "newton_fused", "newton_unfused", "newton_auto", "sequential_fused", "sequential_eager", "cudnn"
)  # fmt: skip
#: Every registered method of the cell scopes: the built-in ones and the peers' (skipped here).
CELL_METHODS = tuple(m for m in method_names() if set(get_method(m).scopes) & set(CELL_SCOPES))
#: The columns the harness documents (docs/benchmarks.md, "pararnn-bench").
DOCUMENTED = (
    "cell", "scope", "method", "direction", "batch", "steps", "width", "dtype", "device",
    "status", "skipped_reason", "median_ms", "floor_ms", "pct_of_floor", "peak_bytes", "max_err",
    "err_ok", "newton_iters", "speedup_vs_sequential_fused", "speedup_vs_cudnn",
    "speedup_vs_sequential_eager",
)  # fmt: skip


def tiny(**overrides: object) -> BenchConfig:
    settings: dict[str, object] = {
        "device": "cpu",
        "shapes": SHAPES,
        "warmup": 1,
        "repeats": 1,
        "copy_bytes": 2**20,
    }
    settings.update(overrides)
    return BenchConfig(**settings)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def result() -> BenchResult:
    return run_bench(tiny(), progress=False)


def test_every_case_has_both_directions(result: BenchResult) -> None:
    assert set(BUILTIN) <= set(CELL_METHODS)
    assert (*CELL_SCOPES, "scan") == SCOPES
    keys = {(r.cell, r.scope, r.method, r.steps, r.direction) for r in result.records}
    expected = {
        (c, s, m, shape.steps, d)
        for c in CELLS
        for s in CELL_SCOPES
        for m in CELL_METHODS
        for shape in SHAPES
        for d in DIRECTIONS
    }
    assert keys == expected
    assert len(result.records) == len(expected)


def test_available_methods_are_timed_and_match_the_float64_reference(
    result: BenchResult,
) -> None:
    for r in result.records:
        if r.method in ("newton_unfused", "newton_auto", "sequential_eager"):
            assert r.status == "ok", (r.method, r.skipped_reason)
        if r.status != "ok":
            continue
        assert r.median_ms is not None and r.median_ms > 0
        assert r.repeats >= 1
        # On the CPU a call's host time is inside its wall time.
        assert r.host_ms is not None and 0 < r.host_ms <= r.median_ms
        assert r.max_err is not None and r.max_err < 1e-4, (r.cell, r.method, r.max_err)
        assert r.err_ok is True
        assert r.reference == "sequential_fp64"
        assert r.floor_ms is not None and r.pct_of_floor is not None
        assert r.peak_bytes is None  # CPU: no CUDA memory statistics
        if r.method == "newton_unfused":  # tol=None: exactly max_iters updates
            assert r.newton_iters == pc.NewtonConfig().max_iters
        if r.method.startswith("newton"):  # the fused chunks may stop early, at 1e-6
            assert r.newton_iters is not None
            assert 1 <= r.newton_iters <= pc.NewtonConfig().max_iters
            assert r.newton_residual is not None and r.newton_residual < 1e-5
    unfused = [r for r in result.records if r.method == "newton_unfused"]
    assert {r.scan_backend for r in unfused} == {"eager"}
    # "auto" keeps the unfused path on the CPU (the fused kernels are picked on CUDA only).
    auto = [r for r in result.records if r.method == "newton_auto"]
    assert auto and {r.scan_backend for r in auto} == {"eager"}


def test_fused_methods_are_skipped_with_a_reason_or_timed(result: BenchResult) -> None:
    for r in result.records:
        if r.method not in ("newton_fused", "sequential_fused"):
            continue
        if r.status == "skipped":
            assert len(r.skipped_reason) > 20, r.skipped_reason
            assert r.median_ms is None
        else:
            assert r.status == "ok", r.skipped_reason
    fused = {r.skipped_reason for r in result.records if r.method == "newton_fused"}
    if fused != {""}:
        assert any("fused" in reason for reason in fused)
    if not hasattr(pc, "fused_sequential_apply"):
        reasons = {r.skipped_reason for r in result.records if r.method == "sequential_fused"}
        assert all("fused_sequential_apply" in reason for reason in reasons)


@pytest.mark.parametrize("mode", ["deferred", "device"])
def test_deferred_newton_stats_time_the_same_solve(
    result: BenchResult, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """``newton_stats="deferred"`` or ``"device"``: the Newton methods run with
    ``NewtonConfig(stats=mode)`` and record the same iterations and residuals as the sync
    run."""
    asked: list[str] = []
    newton_apply = pc.newton_apply

    def spy(*args: Any, **kwargs: Any) -> Any:
        asked.append(kwargs["config"].stats)
        return newton_apply(*args, **kwargs)

    monkeypatch.setattr(pc, "newton_apply", spy)
    deferred = run_bench(
        tiny(cells=("ParaGRU",), methods=("newton_unfused",), newton_stats=mode),
        progress=False,
    )
    assert asked and set(asked) == {mode}
    assert deferred.environment["newton_stats"] == mode
    assert result.environment["newton_stats"] == "sync"
    assert result.environment["cuda_graphs"] is False
    sync = {
        (r.scope, r.steps, r.direction): r
        for r in result.records
        if r.cell == "ParaGRU" and r.method == "newton_unfused"
    }
    assert len(deferred.records) == len(sync) > 0
    for r in deferred.records:
        twin = sync[(r.scope, r.steps, r.direction)]
        assert r.status == "ok" and r.err_ok is True, r.skipped_reason
        assert (r.newton_iters, r.newton_residual) == (twin.newton_iters, twin.newton_residual)


@pytest.mark.parametrize("mode", ["sync", "device"])
def test_fused_sequential_checks_its_states_as_the_newton_methods_wait(
    monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """The fused sequential method runs with ``stats=newton_stats``, so a ratio against a
    Newton method compares two layers that wait for the device alike."""
    if not (triton_interpret_mode() or torch.cuda.is_available()):
        pytest.skip("the fused kernels need TRITON_INTERPRET=1 on the CPU")
    asked: list[str] = []
    fused_sequential_apply = pc.fused_sequential_apply

    def spy(cell: Any, x: Any, h0: Any = None, *, stats: Any = "device") -> Any:
        asked.append(stats)
        return fused_sequential_apply(cell, x, h0, stats=stats)

    monkeypatch.setattr(pc, "fused_sequential_apply", spy)
    config = tiny(
        cells=("ParaGRU",), shapes=SHAPES[:1], methods=("sequential_fused",), newton_stats=mode
    )
    records = run_bench(config, progress=False).records
    assert asked and set(asked) == {mode}
    assert records and all(r.status == "ok" and r.err_ok for r in records), records


def test_cudnn_is_skipped_on_the_cpu(result: BenchResult) -> None:
    cudnn = [r for r in result.records if r.method == "cudnn"]
    assert cudnn and all(r.status == "skipped" and "CUDA" in r.skipped_reason for r in cudnn)


def test_speedups_are_ratios_within_a_case(result: BenchResult) -> None:
    index = {(r.cell, r.scope, r.method, r.steps, r.direction): r for r in result.records}
    for (cell, scope, method, steps, direction), r in index.items():
        if method != "newton_unfused":
            continue
        seq = index[(cell, scope, "sequential_eager", steps, direction)]
        assert r.median_ms is not None and seq.median_ms is not None
        assert r.speedups["sequential_eager"] == pytest.approx(seq.median_ms / r.median_ms)
        assert "cudnn" not in r.speedups and "newton_unfused" not in r.speedups


def test_floor_bytes_follow_the_model() -> None:
    b, t, d = 3, 5, 4
    for name, per_channel in (("ParaGRU", 3 + 1), ("ParaLSTM", 3 + 2), ("ParaSLSTM", 4 + 3)):
        cell = CELLS[name](d, d)
        assert floor_bytes(cell, b, t, torch.float32, "fwd") == b * t * d * per_channel * 4
        assert floor_bytes(cell, b, t, torch.bfloat16, "fwd_bwd") == 3 * b * t * d * per_channel * 2
    with pytest.raises(ValueError, match="direction"):
        floor_bytes(CELLS["ParaGRU"](d, d), b, t, torch.float32, "bwd")


def test_files_parse_with_the_documented_columns(result: BenchResult, tmp_path: Path) -> None:
    written = write_results(result, tmp_path / "out")
    with written.csv.open() as f:
        reader = csv.DictReader(f)
        rows = list(reader)
        header = reader.fieldnames or []
    assert written.csv.name == CSV_NAME and written.json.name == JSON_NAME
    assert list(header[: len(RECORD_COLUMNS)]) == list(RECORD_COLUMNS)
    assert set(DOCUMENTED) <= set(header)
    assert len(rows) == len(result.records)
    ok = [row for row in rows if row["status"] == "ok"]
    assert ok and all(float(row["max_err"]) < 1e-4 for row in ok)
    payload = json.loads(written.json.read_text())
    assert set(payload) == {"environment", "config", "records"}
    assert payload["environment"]["copy_bandwidth_GBps"] > 0
    assert payload["config"]["shapes"] == [list(s) for s in SHAPES]
    assert len(payload["records"]) == len(result.records)
    for record in payload["records"]:
        assert set(RECORD_COLUMNS) | {"speedups"} == set(record)
    if written.plot.path is None:
        assert "matplotlib" in written.plot.message
    else:
        assert written.plot.path == tmp_path / "out" / PLOT_NAME
        assert written.plot.path.stat().st_size > 0
    table = format_table(result)
    assert table.count("\n") == len(result.records) + 1
    assert "x sequential_eager" in table


@pytest.fixture
def peer_methods() -> Iterator[list[str]]:
    """Three peer methods for the registry: one working, one refused by "cuDNN", one broken."""

    def build_copy(case: object, inputs: object, config: object) -> Runner:
        from pararnn_examples.bench import CaseInputs

        assert isinstance(inputs, CaseInputs)
        cell, x = inputs.cell, inputs.inputs

        def forward() -> torch.Tensor:
            with torch.no_grad():
                return pc.sequential_apply(cell, x)

        def forward_backward() -> None:
            pc.sequential_apply(cell, x).sum().backward()

        def reference() -> Reference:
            cell64 = CELLS[type(cell).__name__](cell.d_in, cell.d_h)
            cell64.load_state_dict(cell.state_dict())
            return Reference(pc.sequential_apply(cell64.double(), x.detach().double()), "peer")

        return Runner(forward, forward_backward, reference, reference_key="peer")

    def build_refused(case: object, inputs: object, config: object) -> Runner:
        raise RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED")

    def build_broken(case: object, inputs: object, config: object) -> Runner:
        raise KeyError("boom")

    names = ["peer_copy", "peer_refused", "peer_broken"]
    register_method(Method(names[0], "a peer timed like the eager loop", build_copy))
    register_method(Method(names[1], "a peer cuDNN refuses", build_refused))
    register_method(Method(names[2], "a peer that fails", build_broken))
    try:
        yield names
    finally:
        for name in names:
            unregister_method(name)


def test_registered_peer_methods_plug_in(peer_methods: list[str]) -> None:
    config = tiny(
        cells=("ParaGRU",),
        shapes=(Shape(2, 8, 4),),
        scopes=("layer",),
        methods=("sequential_eager", *peer_methods),
    )
    records = {(r.method, r.direction): r for r in run_bench(config, progress=False).records}
    for direction in DIRECTIONS:
        copy = records[("peer_copy", direction)]
        assert copy.status == "ok" and copy.reference == "peer"
        assert copy.max_err is not None and copy.max_err < 1e-6
        assert set(copy.speedups) == {"sequential_eager"}
        refused = records[("peer_refused", direction)]
        assert (
            refused.status == "skipped" and "CUDNN_STATUS_NOT_SUPPORTED" in refused.skipped_reason
        )
        broken = records[("peer_broken", direction)]
        assert broken.status == "error" and "KeyError" in broken.skipped_reason
    with pytest.raises(KeyError, match="boom"):
        run_bench(
            tiny(cells=("ParaGRU",), shapes=(Shape(1, 4, 2),), methods=(peer_methods[2],),
                 fail_fast=True),
            progress=False,
        )  # fmt: skip
    with pytest.raises(ValueError, match="already registered"):
        register_method(Method(peer_methods[0], "again", lambda *a: None))  # type: ignore[arg-type,return-value]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"methods": ("nope",)}, "methods must be among .* got unknown \\['nope'\\]"),
        ({"cells": ("ParaRNN",)}, "cells must be among"),
        ({"dtypes": ("fp64",)}, "dtypes must be among"),
        ({"scopes": ()}, "scopes must name at least one"),
        ({"shapes": (Shape(0, 8, 4),)}, "shape batch must be a positive int, got 0"),
        ({"repeats": 0}, "repeats must be a positive int, got 0"),
        ({"device": "tpu"}, "device must be 'cuda' or 'cpu', got 'tpu'"),
        (
            {"newton_stats": "later"},
            "newton_stats must be one of \\['sync', 'deferred', 'device'\\], got 'later'",
        ),
        ({"cuda_graphs": True}, "cuda_graphs needs device='cuda', got device='cpu'"),
        ({"projection": "cublas"}, "projection must be one of \\['eager', 'auto'\\], got 'cublas'"),
    ],
)
def test_bad_configs_name_the_option(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        tiny(**overrides)


def test_parse_shape() -> None:
    assert parse_shape("64x4096x1024") == Shape(64, 4096, 1024)
    for bad in ("64x4096", "1x0x4", "axbxc"):
        with pytest.raises(ValueError, match=f"shape must be 'BxTxD'.*got '{bad}'"):
            parse_shape(bad)


def test_cli_help_lists_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for option in ("--out", "--quick", "--device", "--cells", "--methods", "--batch", "--width",
                   "--steps", "--shape", "--dtype", "--scopes", "--max-seq-steps", "--repeats",
                   "--warmup", "--no-plot", "--tf32", "--newton-stats", "--projection"):  # fmt: skip
        assert option in text
    for name in BUILTIN:
        assert name in text


def test_tf32_modes_set_cudnn_and_matmul_alike() -> None:
    # The flags are process-wide (torch.backends' modules refuse monkeypatch): restored below.
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = False, True
        set_tf32("default")  # PyTorch's settings stay
        assert not torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        set_tf32("on")
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        set_tf32("off")
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
        with pytest.raises(ValueError, match="tf32 mode must be one of"):
            set_tf32("maybe")
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def test_cli_rejects_bad_options(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    for argv, message in (
        (["--shape", "1x2"], "shape must be 'BxTxD'"),
        (["--batch", "0"], "argument --batch: expected a positive integer, got '0'"),
        (["--methods", "nope"], "argument --methods: invalid choice: 'nope'"),
        (["--tf32", "maybe"], "argument --tf32: invalid choice: 'maybe'"),
        (["--newton-stats", "later"], "argument --newton-stats: invalid choice: 'later'"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(["--out", str(tmp_path), *argv])
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit):
            main(["--out", str(tmp_path), "--device", "cuda"])
        assert "torch.cuda.is_available() is False" in capsys.readouterr().err


def test_cli_run_writes_the_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench"
    code = main(["--out", str(out), "--quick", "--device", "cpu", "--cells", "ParaLSTM",
                 "--steps", "8", "--width", "4", "--methods", "newton_unfused",
                 "sequential_eager", "--no-progress"])  # fmt: skip
    assert code == 0
    assert (out / CSV_NAME).exists() and (out / JSON_NAME).exists()
    text = capsys.readouterr().out
    assert "| ParaLSTM | fp32 |" in text and "0 errors, 0 outside tolerance" in text
    # Each record was saved as it was measured, and printed as a line without the bar.
    saved = [json.loads(line) for line in (out / "bench.records.jsonl").read_text().splitlines()]
    final = json.loads((out / JSON_NAME).read_text())["records"]
    assert len(saved) == len(final) == 8  # 2 methods x 2 scopes x 2 directions
    assert [(r["method"], r["scope"], r["direction"]) for r in saved] == [
        (r["method"], r["scope"], r["direction"]) for r in final
    ]
    assert text.count("ParaLSTM  ") >= len(saved)

    # --replot redraws the figure and the table from the saved records, measuring nothing.
    replot = tmp_path / "replot"
    code = main(["--out", str(replot), "--replot", str(out / "bench.records.jsonl")])
    text = capsys.readouterr().out
    if "matplotlib" in text:  # plot skipped: only without matplotlib
        assert code == 1
    else:
        assert code == 0 and (replot / PLOT_NAME).stat().st_size > 0
    medians = {f"{r['median_ms']:.3f}" for r in saved if r["median_ms"] is not None}
    assert medians and all(m in text for m in medians)


def test_replot_names_a_bad_line(tmp_path: Path) -> None:
    bad = tmp_path / "bench.records.jsonl"
    bad.write_text('{"cell": "ParaGRU", "colour": 1}\n')
    with pytest.raises(ValueError, match=r"bench.records.jsonl:1: expected a BenchRecord"):
        main(["--out", str(tmp_path), "--replot", str(bad)])


def test_module_entry_point_runs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``python3 -m pararnn_examples.bench`` (how the GPU machine runs it, without install)."""
    monkeypatch.setattr(sys, "argv", ["pararnn_examples.bench", "--help"])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_module("pararnn_examples.bench", run_name="__main__")
    assert exit_info.value.code == 0
    assert "usage: pararnn-bench" in capsys.readouterr().out


@pytest.mark.parametrize("first_is_warm", [False, True])
def test_a_slow_first_call_is_the_timing_only_when_nothing_compiles(first_is_warm: bool) -> None:
    from pararnn_examples.bench.measure import measure

    calls: list[float] = []

    def slow() -> None:
        calls.append(time.perf_counter())
        time.sleep(0.02)

    timing = measure(
        slow, torch.device("cpu"), warmup=3, repeats=5, slow_ms=5.0, first_is_warm=first_is_warm
    )
    # Slow: no further warm-up; one timed call after the first, or the first itself.
    assert len(calls) == (1 if first_is_warm else 2)
    assert len(timing.times_ms) == 1
    assert timing.times_ms[0] >= 20.0
    # The host time of the timed call (the call alone, inside its timing).
    assert len(timing.host_ms) == 1 and 20.0 <= timing.host_ms[0] <= timing.times_ms[0]
    # A fast call is warmed up and repeated whatever the flag says.
    calls.clear()
    timing = measure(
        lambda: calls.append(0.0),
        torch.device("cpu"),
        warmup=3,
        repeats=5,
        slow_ms=5.0,
        first_is_warm=first_is_warm,
    )
    assert len(calls) == 3 + 5 and len(timing.times_ms) == 5
    assert len(timing.host_ms) == 5  # the timed calls only, not the warm-up


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_graphs_time_replays_and_fall_back_with_a_reason() -> None:
    """``cuda_graphs``: the fused Newton layer (``stats="device"``) is timed by graph replays
    and still matches the float64 reference; a method whose capture fails is timed by
    ordinary calls with the reason in its note; a waiting stats mode is refused up front."""
    with pytest.raises(ValueError, match="cuda_graphs needs newton_stats='device'"):
        tiny(device="cuda", cuda_graphs=True)
    config = tiny(
        device="cuda",
        cells=("ParaGRU",),
        shapes=(Shape(2, 256, 24),),
        methods=("newton_fused", "newton_unfused", "sequential_fused", "cudnn"),
        scopes=("layer",),
        cuda_graphs=True,
        newton_stats="device",
        repeats=3,
    )
    found = run_bench(config, progress=False)
    assert found.environment["cuda_graphs"] is True
    by_method = {(r.method, r.direction): r for r in found.records}
    for direction in ("fwd", "fwd_bwd"):
        fused = by_method[("newton_fused", direction)]
        assert fused.status == "ok" and fused.err_ok is True, fused.skipped_reason
        assert "CUDA graph replays" in fused.note and fused.repeats == 3
    for r in found.records:
        assert r.status == "ok", (r.method, r.skipped_reason)
        assert ("CUDA graph replays" in r.note) != ("not captured in a CUDA graph" in r.note)
