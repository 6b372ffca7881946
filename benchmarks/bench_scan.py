"""Benchmark of ``scan_diag`` (Triton) against the copy bandwidth measured in the same run.

Bytes counted per scan: jac and rhs read once, y written once (3 x B·T·D x element size).
Achieved bandwidth over the device-to-device copy bandwidth (bytes read + written) is the figure
of merit; the scan is memory-bound, so 100 % is the ceiling.

    PYTHONPATH=$(ls -d packages/*/src | paste -sd:) python3 benchmarks/bench_scan.py --out DIR
    ... --sweep   # also time launch-plan variants at a few shapes (tuning)
    ... --quick   # a tiny grid, for a smoke run

Writes ``scan_diag.csv``, ``scan_diag.json`` (and ``sweep.csv``) under ``--out`` and prints a
markdown table.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import functools
import json
import math
import platform
from pathlib import Path
from typing import Any

import torch
import triton
import triton.testing

from pararnn_kernels.scan import launch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
METHODS = ("chunked", "lookback", "tiles", "twopass", "streamed")


def median_ms(fn: Any) -> float:
    return float(triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median"))


def copy_bandwidth(device: torch.device) -> float:
    """Bytes/s of a large device-to-device copy, counting bytes read plus bytes written."""
    src = torch.randn(2**30, device=device)
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src))
    return 2 * src.numel() * src.element_size() / (ms * 1e-3)


def shapes(quick: bool) -> list[tuple[int, int, int]]:
    """(B, T, D) with B·T·D from 2^20 to 2^30 and T from 256 to 2^20."""
    totals = [2**20, 2**24] if quick else [2**20, 2**23, 2**26, 2**28, 2**30]
    steps = [256, 4096] if quick else [256, 4096, 65536, 2**20]
    out = []
    for total in totals:
        for t in steps:
            if t > total:
                continue
            channels = total // t
            d = min(channels, 512)
            out.append((channels // d, t, d))
    return out


def random_inputs(
    b: int, t: int, d: int, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    jac = torch.empty(b, t, d, device=device, dtype=dtype).uniform_(-0.99, 0.99)
    rhs = torch.randn(b, t, d, device=device, dtype=dtype)
    return jac, rhs


def check(y: torch.Tensor, jac: torch.Tensor, rhs: torch.Tensor, reverse: bool) -> float:
    """Relative error of a slice against the float64 reference (a cheap correctness guard)."""
    from pararnn_kernels import reference_scan_diag

    sl = slice(0, min(4, jac.shape[2]))
    ref = reference_scan_diag(jac[:1, :, sl].double(), rhs[:1, :, sl].double(), reverse=reverse)
    err = (y[:1, :, sl].double() - ref).abs().max() / ref.abs().max()
    return float(err)


def run_grid(
    args: argparse.Namespace, device: torch.device, copy_bw: float
) -> list[dict[str, Any]]:
    """Every shape with the plan's choice, and each launch method forced, timed side by side."""
    rows: list[dict[str, Any]] = []
    for dtype_name, dtype in DTYPES.items():
        for b, t, d in shapes(args.quick):
            if b * t * d < 2**args.min_log2:
                continue
            jac, rhs = random_inputs(b, t, d, dtype, device)
            nbytes = 3 * jac.numel() * jac.element_size()
            chosen = launch.plan_scan_diag(b, t, d, device, dtype=jac.dtype)
            for reverse in (False, True):
                for method in ("plan", *args.grid_methods):
                    kw = {} if method == "plan" else {"method": method}
                    try:
                        plan = launch.plan_scan_diag(b, t, d, device, dtype=jac.dtype, **kw)
                    except ValueError:  # a method this shape cannot take (streamed, unaligned)
                        continue
                    fn = functools.partial(
                        launch.triton_scan_diag, jac, rhs, None, reverse=reverse, **kw
                    )
                    err = check(fn(), jac, rhs, reverse)
                    ms = median_ms(fn)
                    bw = nbytes / (ms * 1e-3)
                    rows.append(
                        {
                            "dtype": dtype_name,
                            "direction": "reverse" if reverse else "forward",
                            "method": method if method != "plan" else f"plan:{chosen.method}",
                            "B": b,
                            "T": t,
                            "D": d,
                            "BTD_log2": round(math.log2(b * t * d)),
                            "channels": b * d,
                            "rows": plan.rows,
                            "block_t": plan.block_t,
                            "block_d": plan.block_d,
                            "ms": ms,
                            "GBps": bw / 1e9,
                            "frac_copy_bw": bw / copy_bw,
                            "rel_err": err,
                        }
                    )
                    r = rows[-1]
                    print(
                        f"{dtype_name} {r['direction']:7s} {r['method']:14s} B={b:<5d} T={t:<8d} D={d:<4d} "
                        f"{ms:9.4f} ms {bw / 1e9:8.1f} GB/s {100 * bw / copy_bw:6.1f}% err={err:.1e}",
                        flush=True,
                    )
    return rows


SWEEP_CASES = [
    (64, 4096, 1024),
    (8, 65536, 512),
    (1, 2**20, 256),
    (2048, 256, 512),
]
# (block_t, block_d, num_warps) of the tile-scan look-back kernel.
TILES_VARIANTS = [
    (32, 64, 2),
    (32, 64, 4),
    (64, 64, 2),
    (64, 64, 4),
    (64, 64, 8),
    (32, 128, 4),
    (64, 128, 4),
    (64, 128, 8),
    (128, 128, 4),
    (128, 64, 2),
    (16, 128, 2),
    (64, 256, 8),
]
# (block_t, rows, block_d, num_warps, vec, window) of the per-thread-runs look-back kernel.
LOOKBACK_VARIANTS = [
    (64, 16, 64, 4, 2, 16),
    (64, 16, 64, 4, 2, 1),
    (64, 8, 64, 8, 2, 16),
    (32, 8, 64, 4, 2, 16),
    (128, 16, 64, 8, 2, 16),
    (64, 16, 128, 4, 4, 16),
    (64, 16, 32, 4, 1, 16),
    (32, 16, 64, 2, 2, 16),
    (16, 16, 64, 1, 2, 16),
    (64, 8, 128, 8, 4, 16),
    (128, 8, 64, 16, 2, 16),
    (32, 8, 128, 4, 4, 1),
    # One warp and more steps or channels per thread (the one-warp 16 x 64 tile led the 2-byte
    # rows of the 2026-12-03 sweep at B·D >= 2^12), with a window of 4: in an sm_90 compile
    # 16 x 64 takes 128 registers with it and 168 with 16, and 32 x 64 or 16 x 128 spill with
    # 16 but not with 4 (220-254 registers).
    (32, 32, 64, 1, 2, 4),
    (16, 16, 64, 1, 2, 4),
    (16, 16, 128, 1, 4, 4),
    (32, 16, 64, 2, 2, 4),
    # Warps along the channels (block_d = 64 per warp, one group): every warp scans whole
    # columns, nothing crosses warps but the look-back's scalar flags, and a tile moves 2-4x
    # the bytes of the one-warp tiles per chain (same registers per thread: 128 at 16 steps,
    # 236-254 at 32, no spills in an sm_90 compile).
    (32, 32, 256, 4, 2, 4),
    (16, 16, 256, 4, 2, 4),
    (32, 32, 128, 2, 2, 4),
    (16, 16, 128, 2, 2, 4),
]
# The same fields, run with `rescan`: the tile's inputs held in their storage dtype across the
# look-back and scanned again from the incoming state (in an sm_90 compile of the 2-byte forward,
# 96 registers at 16 x 64 against 128, 159 at 32 x 64 against 239, and 64 x 64 fits in 254).
RESCAN_VARIANTS = [
    (16, 16, 64, 1, 2, 4),
    (32, 32, 64, 1, 2, 4),
    (32, 32, 128, 2, 2, 4),
    (64, 64, 64, 1, 2, 4),
    (64, 64, 128, 2, 2, 4),
    (64, 32, 64, 2, 2, 4),
    (32, 16, 64, 2, 2, 16),
    (64, 32, 128, 4, 2, 4),
]
# (block_t, rows, block_d, num_warps, window) of the two-pass look-back kernel (tile steps, chunk
# steps; 8-step chunks take 124 registers in an sm_90 compile, 16-step chunks 222).
TWOPASS_VARIANTS = [
    (256, 8, 64, 1, 16),
    (512, 8, 64, 1, 16),
    (1024, 8, 64, 1, 16),
    (2048, 8, 64, 1, 16),
    (512, 16, 64, 1, 16),
    (512, 8, 128, 2, 16),
]
# (block_t, block_d, num_warps, vec) of the chunked single pass.
CHUNKED_VARIANTS = [
    (8, 64, 1, 2),
    (16, 64, 1, 2),
    (32, 64, 1, 2),
    (64, 64, 1, 2),
    (8, 32, 1, 1),
    (16, 32, 1, 1),
    (32, 32, 1, 1),
    (8, 128, 1, 4),
    (16, 128, 1, 4),
    (32, 128, 1, 4),
    (32, 128, 2, 2),
    (16, 64, 2, 1),
    (16, 256, 1, 8),
]


# (block_t, block_d, num_warps, stages) of the streamed pass (TMA, compute capability >= 9.0);
# forward passes only: a streamed variant's adjoint column times the default adjoint plan.
STREAMED_VARIANTS = [
    (64, 32, 1, 4),
    (32, 32, 1, 4),
    (64, 32, 1, 6),
    (128, 32, 1, 3),
    (64, 64, 2, 4),
    (32, 16, 1, 8),
    (64, 16, 1, 4),
    (64, 16, 1, 8),
    (128, 16, 1, 4),
]


def sweep_variants(methods: tuple[str, ...]) -> list[dict[str, Any]]:
    """The launch plans ``--sweep`` times for ``methods``, the default plan first."""
    variants: list[dict[str, Any]] = [{}]
    if "chunked" in methods:
        variants += [
            {"method": "chunked", "block_t": bt, "block_d": bd, "num_warps": w, "vec": v}
            for bt, bd, w, v in CHUNKED_VARIANTS
        ]
    lookback_fields = ("block_t", "rows", "block_d", "num_warps", "vec", "window")
    if "lookback" in methods:
        variants += [
            {"method": "lookback", **dict(zip(lookback_fields, v, strict=True))}
            for v in LOOKBACK_VARIANTS
        ]
        variants += [
            {"method": "lookback", "rescan": True, **dict(zip(lookback_fields, v, strict=True))}
            for v in RESCAN_VARIANTS
        ]
    if "twopass" in methods:
        fields = ("block_t", "rows", "block_d", "num_warps", "window")
        variants += [
            {"method": "twopass", **dict(zip(fields, v, strict=True))} for v in TWOPASS_VARIANTS
        ]
    if "streamed" in methods:
        variants += [
            {"method": "streamed", "block_t": bt, "block_d": bd, "num_warps": w, "stages": s}
            for bt, bd, w, s in STREAMED_VARIANTS
        ]
    if "tiles" in methods:
        variants += [
            {"method": "tiles", "block_t": bt, "block_d": bd, "num_warps": w}
            for bt, bd, w in TILES_VARIANTS
        ]
    return variants


def run_sweep(
    device: torch.device,
    copy_bw: float,
    methods: tuple[str, ...],
    cases: list[tuple[int, int, int]],
    dtypes: tuple[str, ...] = ("fp32", "bf16"),
) -> list[dict[str, Any]]:
    """Time launch plans of the Triton kernels (forward and adjoint) at representative shapes."""
    rows: list[dict[str, Any]] = []
    for b, t, d in cases:
        for dtype_name in dtypes:
            jac, rhs = random_inputs(b, t, d, DTYPES[dtype_name], device)
            nbytes = 3 * jac.numel() * jac.element_size()
            for kw in sweep_variants(methods):
                try:
                    plan = launch.plan_scan_diag(b, t, d, device, dtype=jac.dtype, **kw)
                except ValueError as err_plan:  # a variant this shape or dtype cannot take
                    print(f"sweep {dtype_name} B={b} T={t} D={d} {kw}: skipped ({err_plan})")
                    continue
                fn = functools.partial(launch.triton_scan_diag, jac, rhs, None, reverse=False, **kw)
                y = fn()
                err = check(y, jac, rhs, False)
                ms = median_ms(fn)
                bw = nbytes / (ms * 1e-3)
                # The adjoint pass reads jac, y and dy and writes drhs and djac: 5 streams.
                grad_y = torch.randn_like(y)
                bwd = functools.partial(
                    launch.triton_scan_diag_backward, jac, y, None, grad_y, reverse=False, **kw
                )
                ms_bwd = median_ms(bwd)
                bw_bwd = 5 / 3 * nbytes / (ms_bwd * 1e-3)
                rows.append(
                    {
                        "dtype": dtype_name,
                        "B": b,
                        "T": t,
                        "D": d,
                        "plan": repr(plan),
                        "ms": ms,
                        "frac_copy_bw": bw / copy_bw,
                        "ms_bwd": ms_bwd,
                        "frac_copy_bw_bwd": bw_bwd / copy_bw,
                        "rel_err": err,
                    }
                )
                print(
                    f"sweep {dtype_name} B={b} T={t} D={d} {kw or 'default'}: {ms:.4f} ms "
                    f"{100 * bw / copy_bw:.1f}% adjoint {ms_bwd:.4f} ms "
                    f"{100 * bw_bwd / copy_bw:.1f}% err={err:.1e}",
                    flush=True,
                )
            del jac, rhs
    return rows


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _shape(text: str) -> tuple[int, int, int]:
    b, t, d = (int(x) for x in text.split(","))
    return b, t, d


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--sweep", action="store_true", help="time look-back tile shapes first")
    parser.add_argument("--no-grid", action="store_true")
    parser.add_argument(
        "--min-log2", type=int, default=0, help="grid: only shapes with B·T·D >= 2**MIN_LOG2"
    )
    parser.add_argument(
        "--grid-methods",
        nargs="*",
        choices=METHODS,
        default=list(METHODS),
        help="launch methods forced beside the plan's choice in the grid",
    )
    parser.add_argument(
        "--sweep-methods",
        nargs="+",
        choices=METHODS,
        default=list(METHODS),
        help="kernels whose launch shapes --sweep times (beside the default plan)",
    )
    parser.add_argument(
        "--sweep-shapes",
        nargs="+",
        type=_shape,
        default=SWEEP_CASES,
        metavar="B,T,D",
        help="shapes --sweep times",
    )
    parser.add_argument(
        "--sweep-dtypes",
        nargs="+",
        choices=("fp32", "bf16"),
        default=["fp32", "bf16"],
        help="storage dtypes --sweep times",
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_scan.py needs a CUDA GPU")
    device = torch.device("cuda")
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
    }
    copy_bw = copy_bandwidth(device)
    meta["copy_GBps"] = copy_bw / 1e9
    print(json.dumps(meta), flush=True)
    if args.sweep:
        rows = run_sweep(
            device,
            copy_bw,
            tuple(args.sweep_methods),
            args.sweep_shapes,
            tuple(args.sweep_dtypes),
        )
        write_csv(args.out / "sweep.csv", rows)
    if args.no_grid:
        return
    rows = run_grid(args, device, copy_bw)
    write_csv(args.out / "scan_diag.csv", rows)
    (args.out / "scan_diag.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print("\n| dtype | dir | method | B | T | D | B·D | ms | GB/s | % of copy |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['dtype']} | {r['direction']} | {r['method']} | {r['B']} | {r['T']} | {r['D']} | "
            f"{r['channels']} | {r['ms']:.4f} | {r['GBps']:.0f} | {100 * r['frac_copy_bw']:.1f} |"
        )


if __name__ == "__main__":
    main()
