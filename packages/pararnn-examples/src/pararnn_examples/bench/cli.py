"""pararnn-bench: time ParaGRU / ParaLSTM / ParaSLSTM layers by every method in one run.

For each cell, shape (B, T, d), dtype and scope it times the forward (under no_grad) and the
forward+backward of each method, checks each method's forward output against a float64 reference,
and reports medians, speed-ups between the methods of the run, the HBM floor (bytes of one read of
the inputs and one write of the outputs, over the copy bandwidth measured at the start of the
run) and CUDA peak memory. Scopes: "recurrence" times u [B, T, d_u] -> states (the floor's work,
projection excluded); "layer" times x [B, T, d] -> states with the input projection, as users call
it (the only scope with cuDNN); "scan" (not run unless asked for) times the linear recurrence
y_t = a_t * y_{t-1} + b_t alone at the --scan-shape sizes: scan_diag against the peers' scans,
as a fraction of the copy floor. Peers (accelerated-scan, fla, FlashRNN: the optional
dependency group pararnn-examples[bench]) are used when they import and skipped, with the reason,
when not; the first lines of the output say which. Writes DIR/bench.records.jsonl as records
are measured (a run cut short keeps what it measured), then DIR/bench.csv, DIR/bench.json,
DIR/bench_time_vs_T.png and prints a markdown table. Exit status 1 when a case raised an error
or a forward output is outside its tolerance (the files are written first).

Examples:
  pararnn-bench --out bench_out                  # defaults: B=8, d=256, T=1024 4096 16384
  pararnn-bench --out bench_out --shape 64x4096x1024 --shape 1x65536x256
  pararnn-bench --out /tmp/b --quick --device cpu
  python3 -m pararnn_examples.bench --out bench_out --cells ParaGRU --methods newton_unfused cudnn
  pararnn-bench --out scan_out --scopes scan --dtype fp32 bf16 \\
      --methods scan_diag_triton accelerated_scan fla_chunk_hgrn
  pararnn-bench --out layers_out --scopes layer --dtype bf16 fp32 --methods newton_fused flashrnn
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pararnn_core as pc

from ..argtypes import positive_float, positive_int
from .cases import (
    CELL_SCOPES,
    CELLS,
    DTYPES,
    NEWTON_STATS,
    PROJECTION_BACKENDS,
    SCAN_SHAPES,
    SCOPES,
    BenchConfig,
    Shape,
    default_device,
    grid_shapes,
    parse_shape,
)
from .harness import BenchRecord, BenchResult, progress_line, run_bench
from .measure import TF32_MODES, set_tf32
from .registry import get_method, method_names
from .report import (
    PLOT_NAME,
    format_peers,
    format_table,
    load_records,
    plot_time_vs_steps,
    result_from_records,
    write_results,
)

__all__ = ["build_parser", "config_from_args", "main"]


@dataclass(frozen=True)
class _Sizes:
    batch: int
    width: int
    steps: tuple[int, ...]
    repeats: int
    warmup: int


_QUICK = _Sizes(batch=2, width=16, steps=(32, 128), repeats=3, warmup=1)
_QUICK_SCAN_SHAPES = (Shape(2, 128, 16), Shape(1, 256, 8))
_NORMAL = _Sizes(batch=8, width=256, steps=(1024, 4096, 16384), repeats=10, warmup=3)


def _shape(text: str) -> Shape:
    try:
        return parse_shape(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


class _Formatter(argparse.RawDescriptionHelpFormatter):
    pass


def _epilog() -> str:
    lines = ["methods (scope 'scan' or the cell scopes; [peer] = the bench extra):"]
    for name in method_names():
        method = get_method(name)
        peer = " [peer]" if method.peer is not None else ""
        lines.append(f"  {name:22s} {method.summary}{peer}")
    lines += [
        "",
        "columns (CSV and JSON; see docs/benchmarks.md, 'pararnn-bench'):",
        "  cell scope method direction batch steps width dtype device status skipped_reason",
        "  median_ms min_ms repeats host_ms floor_bytes floor_ms pct_of_floor peak_bytes",
        "  peak_above_start_bytes max_err err_tol err_ok reference newton_iters newton_residual",
        "  scan_backend note, then speedup_vs_<method> (JSON: speedups {method: ratio}).",
    ]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The ``pararnn-bench`` argument parser (every option documented in ``--help``)."""
    parser = argparse.ArgumentParser(
        prog="pararnn-bench",
        description=__doc__,
        epilog=_epilog(),
        formatter_class=_Formatter,
    )
    parser.add_argument(
        "--out",
        type=Path,
        required=True,
        metavar="DIR",
        help="output directory (created) for bench.csv, bench.json and the plot",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes for a smoke run: B=2, d=16, T=32 128, 1 warm-up, "
        "3 repeats (options given explicitly still win)",
    )
    parser.add_argument(
        "--device",
        choices=["cuda", "cpu"],
        default=None,
        help="default: cuda when a GPU is visible, else cpu (on the CPU Triton is "
        "not used and cuDNN is skipped)",
    )
    parser.add_argument(
        "--cells",
        nargs="+",
        choices=list(CELLS),
        default=list(CELLS),
        metavar="CELL",
        help=f"cell layers (default: all of {list(CELLS)})",
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        choices=list(method_names()),
        default=list(method_names()),
        metavar="METHOD",
        help="methods to time, in table order, each in the scopes it serves (default: all, "
        "listed below)",
    )
    parser.add_argument(
        "--batch",
        type=positive_int,
        default=None,
        metavar="B",
        help="batch size B of the T grid (default 8; --quick 2)",
    )
    parser.add_argument(
        "--width",
        type=positive_int,
        default=None,
        metavar="D",
        help="d_in = d_h of the T grid (default 256; --quick 16)",
    )
    parser.add_argument(
        "--steps",
        type=positive_int,
        nargs="+",
        default=None,
        metavar="T",
        help="sequence lengths of the grid (default 1024 4096 16384; --quick 32 128)",
    )
    parser.add_argument(
        "--shape",
        type=_shape,
        action="append",
        default=[],
        metavar="BxTxD",
        help="an extra shape beyond the grid, e.g. 64x4096x1024 (repeatable)",
    )
    parser.add_argument(
        "--scan-shape",
        type=_shape,
        action="append",
        default=[],
        metavar="BxTxD",
        help="a shape of scope 'scan' (repeatable; default: "
        + " ".join(str(s) for s in SCAN_SHAPES)
        + "; --quick: "
        + " ".join(str(s) for s in _QUICK_SCAN_SHAPES)
        + ")",
    )
    parser.add_argument(
        "--dtype",
        nargs="+",
        choices=list(DTYPES),
        default=["fp32"],
        help="storage dtypes (default fp32); bf16 needs compute capability 8.0",
    )
    parser.add_argument(
        "--scopes",
        nargs="+",
        choices=list(SCOPES),
        default=list(CELL_SCOPES),
        help="recurrence: u -> states, the floor's work; layer: x -> states with "
        "the input projection, and cuDNN; scan: the linear recurrence alone, scan_diag "
        "against the peers' scans (default: recurrence layer)",
    )
    parser.add_argument(
        "--max-seq-steps",
        type=positive_int,
        default=4096,
        metavar="T",
        help="time sequential_eager only up to this T (recorded as skipped "
        "above); the float64 reference is sequential up to it and a "
        "converged float64 Newton solve above (default 4096)",
    )
    parser.add_argument(
        "--repeats",
        type=positive_int,
        default=None,
        help="timed calls per case, median reported (default 10; --quick 3)",
    )
    parser.add_argument(
        "--warmup",
        type=positive_int,
        default=None,
        help="warm-up calls per case, >= 1 (default 3; --quick 1)",
    )
    parser.add_argument(
        "--slow-seconds",
        type=positive_float,
        default=0.5,
        metavar="S",
        help="a case whose warm-up call takes longer is timed once (default 0.5)",
    )
    parser.add_argument(
        "--newton-iters",
        type=positive_int,
        default=None,
        metavar="K",
        help="NewtonConfig.max_iters of the Newton methods (default: NewtonConfig's, 3)",
    )
    parser.add_argument(
        "--newton-tol",
        type=positive_float,
        default=None,
        metavar="TOL",
        help="NewtonConfig.tol of the Newton methods (default: none, exactly "
        "--newton-iters iterations)",
    )
    parser.add_argument(
        "--newton-stats",
        choices=NEWTON_STATS,
        default=None,
        help="NewtonConfig.stats of the Newton methods, and when the fused sequential "
        "method checks its states: 'sync' (default without "
        "--cuda-graphs) reads the solve's statistics back in the forward, 'deferred' lets "
        "the forward return without waiting, 'device' (the default and the only choice with "
        "--cuda-graphs) waits for nothing at all (the statistics are read after each case's "
        "first call)",
    )
    parser.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="time every method's calls as replays of a CUDA graph captured after the "
        "warm-up, leaving the host's launch work out (a method that cannot be captured is "
        "timed by ordinary calls, and its records say why)",
    )
    parser.add_argument(
        "--copy-mib",
        type=positive_int,
        default=None,
        metavar="MIB",
        help="buffer size of the copy-bandwidth measurement (default 4096 MiB "
        "on CUDA, 64 on the CPU; --quick on the CPU 16)",
    )
    parser.add_argument(
        "--tf32",
        choices=TF32_MODES,
        default="default",
        help="fp32 multiplies: 'default' keeps PyTorch's settings (cuDNN in TF32, matmuls in "
        "fp32), 'off' runs every method in fp32, 'on' every method in TF32 (cuDNN and the "
        "input projections); the settings are recorded with the results",
    )
    parser.add_argument(
        "--projection",
        choices=PROJECTION_BACKENDS,
        default="auto",
        help="the cells' input projection: 'auto' (default, the cells' own default) runs "
        "float32 GPU products on the tensor cores to float32 accuracy "
        "(pararnn_kernels.linear_tf32x3), 'eager' is F.linear",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of parameters and inputs")
    parser.add_argument("--no-plot", action="store_true", help="do not draw the plot")
    parser.add_argument(
        "--replot",
        type=Path,
        nargs="+",
        metavar="JSONL",
        help="measure nothing: draw DIR/bench_time_vs_T.png and print the table from the "
        "bench.records.jsonl files of earlier runs (e.g. runs cut short)",
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bar and no per-record lines"
    )
    parser.add_argument(
        "--fail-fast",
        action="store_true",
        help="re-raise an unexpected error instead of recording it and going on",
    )
    return parser


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """The :class:`BenchConfig` of parsed arguments (``--quick`` fills unset sizes).

    Raises:
        ValueError: an inconsistent combination (e.g. ``--device cuda`` without a GPU).
    """
    sizes = _QUICK if args.quick else _NORMAL
    batch = args.batch if args.batch is not None else sizes.batch
    width = args.width if args.width is not None else sizes.width
    steps = args.steps if args.steps is not None else sizes.steps
    device = args.device if args.device is not None else default_device()
    # A GPU's copy must stay far larger than its L2 cache even in a smoke run.
    quick_copy = 16 if args.quick and device == "cpu" else None
    copy_mib = args.copy_mib if args.copy_mib is not None else quick_copy
    scan_shapes = args.scan_shape or (_QUICK_SCAN_SHAPES if args.quick else SCAN_SHAPES)
    return BenchConfig(
        cells=tuple(args.cells),
        methods=tuple(dict.fromkeys(args.methods)),
        shapes=tuple(dict.fromkeys([*grid_shapes(batch, width, steps), *args.shape])),
        scan_shapes=tuple(dict.fromkeys(scan_shapes)),
        dtypes=tuple(dict.fromkeys(args.dtype)),
        scopes=tuple(dict.fromkeys(args.scopes)),
        warmup=args.warmup if args.warmup is not None else sizes.warmup,
        repeats=args.repeats if args.repeats is not None else sizes.repeats,
        slow_ms=args.slow_seconds * 1e3,
        max_seq_steps=args.max_seq_steps,
        newton_tol=args.newton_tol,
        newton_stats=args.newton_stats or ("device" if args.cuda_graphs else "sync"),
        cuda_graphs=args.cuda_graphs,
        projection=args.projection,
        copy_bytes=None if copy_mib is None else copy_mib * 2**20,
        seed=args.seed,
        fail_fast=args.fail_fast,
        device=device,
        newton_iters=(
            args.newton_iters if args.newton_iters is not None else pc.NewtonConfig().max_iters
        ),
    )


def _summary(result: BenchResult) -> tuple[str, bool]:
    records = result.records
    timed = sum(r.status == "ok" for r in records)
    skipped = sum(r.status == "skipped" for r in records)
    errors = [r for r in records if r.status == "error"]
    mismatches = [r for r in records if r.err_ok is False]
    text = (
        f"{len(records)} records: {timed} timed, {skipped} skipped, {len(errors)} errors, "
        f"{len(mismatches)} outside tolerance"
    )
    for r in [*errors, *mismatches][:10]:
        text += (
            f"\n  {r.status if r.status == 'error' else 'mismatch'}: {r.cell} {r.scope} "
            f"{r.method} {r.direction} B={r.batch} T={r.steps} d={r.width} {r.dtype}: "
            f"{r.skipped_reason or f'max_err {r.max_err} > {r.err_tol}'}"
        )
    return text, not errors and not mismatches


def _replot(paths: Sequence[Path], out: Path) -> int:
    records = [r for path in paths for r in load_records(path)]
    result = result_from_records(records, " ".join(str(p) for p in paths))
    out.mkdir(parents=True, exist_ok=True)
    print(format_table(result))
    outcome = plot_time_vs_steps(result, out / PLOT_NAME)
    print(outcome.message)
    return 0 if outcome.path is not None else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``pararnn-bench``; returns the exit status (0 ok, 1 errors or mismatches)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.replot:
        return _replot(args.replot, args.out)
    try:
        config = config_from_args(args)
    except ValueError as err:
        parser.error(str(err))
    set_tf32(args.tf32)
    args.out.mkdir(parents=True, exist_ok=True)
    partial = args.out / "bench.records.jsonl"
    with partial.open("w") as log:

        def save(record: BenchRecord) -> None:
            log.write(json.dumps(dataclasses.asdict(record), default=str) + "\n")
            log.flush()
            if args.no_progress:  # no bar: still one line per record, as it is measured
                print(progress_line(record), flush=True)

        result = run_bench(config, progress=not args.no_progress, on_record=save)
    written = write_results(result, args.out, plot=not args.no_plot)
    print()
    peers = format_peers(result)
    if peers:
        print(peers)
        print()
    print(format_table(result))
    print()
    env = result.environment
    print(
        f"device {env.get('gpu', env['device'])}, torch {env['torch']}, triton {env['triton']}, "
        f"copy bandwidth {env['copy_bandwidth_GBps']:.0f} GB/s, {env['date']}"
    )
    summary, ok = _summary(result)
    print(summary)
    print(f"wrote {written.csv} and {written.json}")
    print(written.plot.message)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
