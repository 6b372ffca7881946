#!/usr/bin/env python3
"""Benchmark the unfused ParaRNN path: Newton (scans) vs the sequential recurrence vs cuDNN.

For each cell (ParaGRU, ParaLSTM, ParaSLSTM) and sequence length T, one layer of width d_h on
inputs ``[B, T, d_h]``, fp32, this times

* ``newton``     -- ``ParaRNN(cell).train()``: Newton with the configured scan backend (Triton);
* ``sequential`` -- ``sequential_apply``: the one-step recurrence, a Python loop over T;
* ``cudnn``      -- ``nn.GRU`` / ``nn.LSTM`` of the same width (batch_first), for GRU and LSTM;

in two modes: ``fwd`` (under ``torch.no_grad()``) and ``fwd_bwd`` (forward, then backward of
``y.sum()`` into the input and every parameter). Each case: warm-up calls, then repeats timed with
CUDA events; the median is reported, with the peak ``torch.cuda.max_memory_allocated`` of the case
(and the part above what was allocated before it). Slow cases (one call longer than
``--slow-seconds``) are timed once.

Results go to ``--out``: ``bench_core.csv``, ``bench_core.json`` (with the environment), and a
table on stdout. ``--quick`` is a tiny CPU smoke run (no cuDNN, no memory numbers).

Usage (repository root)::

    PYTHONPATH=packages/pararnn-kernels/src:packages/pararnn-core/src \\
        python3 benchmarks/bench_core.py --out bench_out/core
    python3 benchmarks/bench_core.py --quick --out /tmp/bench_core_quick
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

import pararnn_core as pc

CELLS: dict[str, Callable[..., pc.ParaCell]] = {
    "ParaGRU": pc.ParaGRU,
    "ParaLSTM": pc.ParaLSTM,
    "ParaSLSTM": pc.ParaSLSTM,
}
CUDNN: dict[str, Callable[..., nn.RNNBase]] = {"ParaGRU": nn.GRU, "ParaLSTM": nn.LSTM}


@dataclass
class Row:
    cell: str
    method: str
    mode: str
    steps: int
    batch: int
    width: int
    dtype: str
    device: str
    median_ms: float | None
    min_ms: float | None
    repeats: int
    peak_mem_mb: float | None
    peak_above_start_mb: float | None
    newton_iters: int | None = None
    newton_residual: float | None = None
    scan_backend: str | None = None
    note: str = ""


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_once(fn: Callable[[], object], device: torch.device) -> float:
    """One call, in milliseconds (CUDA events on GPU, perf_counter on CPU)."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end))
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def measure(
    fn: Callable[[], object],
    device: torch.device,
    *,
    warmup: int,
    repeats: int,
    slow_ms: float,
) -> tuple[list[float], float | None, float | None]:
    """Timings of ``fn`` and its peak memory (MB, and MB above the memory allocated at the start)."""
    _sync(device)
    first = _time_once(fn, device)  # also the first warm-up call
    if first > slow_ms:
        times = [first]
    else:
        for _ in range(max(warmup - 1, 0)):
            fn()
        _sync(device)
        times = [_time_once(fn, device) for _ in range(repeats)]
    peak = above = None
    if device.type == "cuda":
        torch.cuda.empty_cache()
        start_mem = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        _sync(device)
        peak_bytes = torch.cuda.max_memory_allocated(device)
        peak, above = peak_bytes / 2**20, (peak_bytes - start_mem) / 2**20
    return times, peak, above


def _clear_grads(*modules: nn.Module) -> None:
    for module in modules:
        for p in module.parameters():
            p.grad = None


def cases_for(
    cell_name: str,
    steps: int,
    args: argparse.Namespace,
    device: torch.device,
) -> list[tuple[str, str, Callable[[], object], Callable[[], dict[str, object]]]]:
    """(method, mode, fn, extra-info) for one cell and length."""
    dtype = torch.float32
    cell = CELLS[cell_name](args.width, args.width, device=device, dtype=dtype)
    config = pc.NewtonConfig(scan_backend=args.backend)
    newton = pc.ParaRNN(cell, config).train()
    x = torch.randn(args.batch, steps, args.width, device=device, dtype=dtype)
    x_grad = x.clone().requires_grad_()

    def info() -> dict[str, object]:
        stats = newton.last_stats[0] if newton.last_stats else None
        if stats is None:
            return {}
        return {
            "newton_iters": stats.iters,
            "newton_residual": stats.max_residual,
            "scan_backend": stats.backend,
        }

    def none() -> dict[str, object]:
        return {}

    def newton_fwd() -> object:
        with torch.no_grad():
            return newton(x)

    def newton_fwd_bwd() -> object:
        _clear_grads(newton)
        x_grad.grad = None
        newton(x_grad).sum().backward()
        return None

    def seq_fwd() -> object:
        with torch.no_grad():
            return pc.sequential_apply(cell, x)

    def seq_fwd_bwd() -> object:
        _clear_grads(cell)
        x_grad.grad = None
        cell.output(pc.sequential_apply(cell, x_grad)).sum().backward()
        return None

    out: list[tuple[str, str, Callable[[], object], Callable[[], dict[str, object]]]] = [
        ("newton", "fwd", newton_fwd, info),
        ("newton", "fwd_bwd", newton_fwd_bwd, info),
    ]
    if steps <= args.seq_max_steps:
        out += [("sequential", "fwd", seq_fwd, none), ("sequential", "fwd_bwd", seq_fwd_bwd, none)]
    if device.type == "cuda" and cell_name in CUDNN and not args.no_cudnn:
        rnn = CUDNN[cell_name](args.width, args.width, batch_first=True, device=device, dtype=dtype)

        def cudnn_fwd() -> object:
            with torch.no_grad():
                return rnn(x)[0]

        def cudnn_fwd_bwd() -> object:
            _clear_grads(rnn)
            x_grad.grad = None
            rnn(x_grad)[0].sum().backward()
            return None

        out += [("cudnn", "fwd", cudnn_fwd, none), ("cudnn", "fwd_bwd", cudnn_fwd_bwd, none)]
    return out


def run(args: argparse.Namespace) -> list[Row]:
    device = torch.device(args.device)
    rows: list[Row] = []
    for cell_name in args.cells:
        for steps in args.steps:
            for method, mode, fn, info in cases_for(cell_name, steps, args, device):
                base = {
                    "cell": cell_name,
                    "method": method,
                    "mode": mode,
                    "steps": steps,
                    "batch": args.batch,
                    "width": args.width,
                    "dtype": "float32",
                    "device": str(device),
                }
                try:
                    times, peak, above = measure(
                        fn,
                        device,
                        warmup=args.warmup,
                        repeats=args.repeats,
                        slow_ms=args.slow_seconds * 1e3,
                    )
                except torch.cuda.OutOfMemoryError:
                    torch.cuda.empty_cache()
                    row = Row(**base, median_ms=None, min_ms=None, repeats=0, peak_mem_mb=None,
                              peak_above_start_mb=None, note="out of memory")  # fmt: skip
                except RuntimeError as err:
                    # cuDNN refuses some shapes (seen: nn.GRU at B=8, T=65536 on the H200 gives
                    # CUDNN_STATUS_NOT_SUPPORTED); record it and go on with the other cases.
                    if "cuDNN" not in str(err) and "CUDNN" not in str(err):
                        raise
                    torch.cuda.empty_cache()
                    row = Row(**base, median_ms=None, min_ms=None, repeats=0, peak_mem_mb=None,
                              peak_above_start_mb=None, note=f"cuDNN: {str(err).splitlines()[0][:60]}")  # fmt: skip
                else:
                    extra = info()
                    row = Row(
                        **base,
                        median_ms=statistics.median(times),
                        min_ms=min(times),
                        repeats=len(times),
                        peak_mem_mb=peak,
                        peak_above_start_mb=above,
                        newton_iters=extra.get("newton_iters"),  # type: ignore[arg-type]
                        newton_residual=extra.get("newton_residual"),  # type: ignore[arg-type]
                        scan_backend=extra.get("scan_backend"),  # type: ignore[arg-type]
                        note="timed once (slow)" if len(times) == 1 and args.repeats > 1 else "",
                    )
                rows.append(row)
                print(_progress(row), flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rows


def _fmt_ms(value: float | None) -> str:
    return f"{'-':>10s}" if value is None else f"{value:10.3f}"


def _progress(row: Row) -> str:
    mem = "" if row.peak_mem_mb is None else f"  peak {row.peak_mem_mb:9.1f} MB"
    return (
        f"  {row.cell:9s} T={row.steps:<6d} {row.method:10s} {row.mode:7s} "
        f"{_fmt_ms(row.median_ms)} ms (n={row.repeats}){mem} {row.note}"
    )


def table(rows: list[Row]) -> str:
    """Per (cell, T, mode): the three methods side by side and Newton's speed-up."""
    index = {(r.cell, r.steps, r.mode, r.method): r for r in rows}
    keys = sorted({(r.cell, r.steps, r.mode) for r in rows}, key=lambda k: (k[0], k[2], k[1]))
    head = (
        f"{'cell':9s} {'mode':7s} {'T':>6s} | {'newton ms':>10s} {'seq ms':>10s} {'cudnn ms':>10s}"
        f" | {'seq/newton':>10s} {'cudnn/newton':>12s} | {'newton MB':>9s} {'seq MB':>9s}"
        f" {'cudnn MB':>9s} | iters  residual"
    )
    lines = [head, "-" * len(head)]
    for cell, steps, mode in keys:
        got = {m: index.get((cell, steps, mode, m)) for m in ("newton", "sequential", "cudnn")}
        ms = {m: (r.median_ms if r else None) for m, r in got.items()}
        mb = {m: (r.peak_mem_mb if r else None) for m, r in got.items()}

        def ratio(a: float | None, b: float | None) -> str:
            return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}x"

        def mem(v: float | None) -> str:
            return f"{v:9.1f}" if v is not None else f"{'-':>9s}"

        newton = got["newton"]
        iters = "-" if newton is None or newton.newton_iters is None else str(newton.newton_iters)
        res = (
            "-"
            if newton is None or newton.newton_residual is None
            else f"{newton.newton_residual:.1e}"
        )
        lines.append(
            f"{cell:9s} {mode:7s} {steps:6d} | {_fmt_ms(ms['newton'])} {_fmt_ms(ms['sequential'])}"
            f" {_fmt_ms(ms['cudnn'])} | {ratio(ms['sequential'], ms['newton']):>10s}"
            f" {ratio(ms['cudnn'], ms['newton']):>12s} | {mem(mb['newton'])} {mem(mb['sequential'])}"
            f" {mem(mb['cudnn'])} | {iters:>5s}  {res}"
        )
    return "\n".join(lines)


def environment(args: argparse.Namespace) -> dict[str, object]:
    env: dict[str, object] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "pararnn_core": pc.__version__,
        "args": vars(args),
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    if torch.cuda.is_available() and args.device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(args.device))
        env["gpu"] = props.name
        env["gpu_memory_gb"] = round(props.total_memory / 2**30, 1)
        env["cudnn"] = torch.backends.cudnn.version()
    return env


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--quick", action="store_true", help="tiny CPU smoke run")
    parser.add_argument("--cells", nargs="+", choices=sorted(CELLS), default=list(CELLS))
    parser.add_argument("--steps", nargs="+", type=int, default=[1024, 4096, 16384, 65536])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--width", type=int, default=256, help="d_in = d_h")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--slow-seconds", type=float, default=1.0,
                        help="a case whose first call takes longer is timed once")  # fmt: skip
    parser.add_argument("--seq-max-steps", type=int, default=65536,
                        help="skip the sequential baseline above this T")  # fmt: skip
    parser.add_argument("--backend", default=None,
                        help="Newton scan backend (default: triton on CUDA, auto elsewhere)")  # fmt: skip
    parser.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    parser.add_argument("--no-cudnn", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.device = args.device or "cpu"
        args.steps, args.batch, args.width = [16, 64], 2, 8
        args.warmup, args.repeats = 1, 3
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.backend is None:
        args.backend = "triton" if args.device.startswith("cuda") else "auto"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    env = environment(args)
    print(
        f"bench_core: {env.get('gpu', args.device)}, torch {env['torch']}, triton {env['triton']}"
    )
    rows = run(args)
    records = [asdict(r) for r in rows]
    with (args.out / "bench_core.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(records[0]))
        writer.writeheader()
        writer.writerows(records)
    env["args"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    clean = [
        {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()}
        for r in records
    ]
    (args.out / "bench_core.json").write_text(
        json.dumps({"environment": env, "rows": clean}, indent=2)
    )
    print()
    print(table(rows))
    print(f"\nwrote {args.out / 'bench_core.csv'} and {args.out / 'bench_core.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
