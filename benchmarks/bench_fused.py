"""Launch-shape sweep of the fused kernels (the numbers behind their cost model).

Times, on one CUDA GPU, the fused GRU Newton kernel over a grid of launch plans, the fused
backward over its tile shapes, and the fused sequential kernel, at each shape, as kernels on the
projected inputs ``u [B, T, 3D]`` (and with ``--block-cells`` ParaLSTM's and ParaSLSTM's kernels
likewise) (the layer benchmark with the projection and peers is ``pararnn-bench``).
Every case is checked against the fused sequential kernel (max abs difference printed), and each
shape's line names the cost model's estimates and pick beside the measured times.

    python3 benchmarks/bench_fused.py --out OUT/fused          # every sweep, five shapes
    python3 benchmarks/bench_fused.py --out OUT/fused --kinds --shapes 8x128x256 8x4096x256
                                                               # the default plans only
    python3 benchmarks/bench_fused.py --out OUT/fused --kinds sequential --block-cells lstm slstm
                                       # also the block cells' sequential kernels over plans
    python3 benchmarks/bench_fused.py --out OUT/fused --kinds --block-cells lstm slstm
                                       # every cell's default Newton and sequential kernels
    python3 benchmarks/bench_fused.py --out OUT/fused --kinds newton backward \
        --block-cells lstm slstm --tiles 128x4x2 64x8x2   # Newton and backward tiles, every cell
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

import torch
import triton.testing

from pararnn_examples.bench import parse_shape
from pararnn_kernels.fused import (
    FusedPlan,
    choose_fused_gru_method,
    choose_fused_lstm_method,
    choose_fused_slstm_method,
    estimate_fused_gru_seconds,
    estimate_fused_lstm_seconds,
    estimate_fused_slstm_seconds,
    fused_gru_backward,
    fused_gru_newton,
    fused_gru_sequential,
    fused_lstm_backward,
    fused_lstm_newton,
    fused_lstm_sequential,
    fused_slstm_backward,
    fused_slstm_newton,
    fused_slstm_sequential,
    plan_fused_gru,
    plan_fused_lstm,
    plan_fused_slstm,
)

#: (block_t, block_d, num_warps) tried; at most 64 tile elements per thread.
TILES = [
    (bt, bd, w)
    for bt in (64, 128, 256, 512)
    for bd in (1, 2, 4, 8, 16)
    for w in (1, 2, 4)
    if bt * bd // (32 * w) <= 64 and bt * bd >= 32 * w
]
#: (block_d, rows, num_warps, vec) of the sequential kernel: whole tiles per thread
#: (block_d = 32 · warps · vec) at 4-16 steps, and the two plans it had before (vectors of 4,
#: steps spread over threads).
SEQUENTIAL_PLANS = [
    *((32 * w * v, rows, w, v) for v in (1, 2, 4) for w in (1, 2) for rows in (4, 8, 16)),
    (16, 4, 1, 4),
    (64, 1, 2, 4),
]
#: (block_d, rows, num_warps, vec) of the block cells' sequential kernels (the default is
#: timed besides).
#: Whole tiles of 16 steps spill registers there (sm_90 compile), so 4-8 steps.
BLOCK_SEQUENTIAL_PLANS = [
    (64, 4, 1, 2),
    (64, 8, 1, 2),
    (128, 8, 2, 2),
    (128, 4, 1, 4),
    (32, 8, 1, 1),
    (64, 2, 1, 2),
    (128, 8, 1, 4),
    (256, 4, 2, 4),
]
#: (block_t, block_d, num_warps) of the block cells' Newton kernels (their defaults, 128 × 4 on
#: 4 warps for ParaLSTM and 64 × 4 on 2 warps for ParaSLSTM, are timed besides; segments as the
#: plan picks).
BLOCK_NEWTON_TILES = [
    (32, 4, 1),
    (64, 2, 1),
    (64, 4, 2),
    (64, 4, 4),
    (128, 1, 1),
    (128, 2, 1),
    (128, 2, 2),
    (128, 4, 4),
    (256, 1, 1),
    (256, 2, 2),
]
#: (block_t, block_d, num_warps) of the block cells' backward kernels (the default is timed
#: besides).
BLOCK_BACKWARD_TILES = [
    (16, 8, 4),
    (32, 8, 4),
    (32, 16, 8),
    (64, 4, 4),
    (64, 8, 4),
    (128, 1, 1),
    (128, 2, 2),
]
SHAPES = [(8, 1024, 256), (8, 4096, 256), (8, 16384, 256), (64, 4096, 1024), (1, 65536, 256)]


#: cell -> (gate blocks of u, rows of each recurrent parameter): GRU [3, D]; LSTM recurrent
#: [3, D] and peephole [2, D]; sLSTM recurrent [4, D].
CELL_LAYOUTS = {"gru": (3, (3,)), "lstm": (3, (3, 2)), "slstm": (4, (4,))}


def layer_inputs(
    cell: str, batch: int, steps: int, channels: int, dev: torch.device
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Seeded projected inputs ``u`` and recurrent parameters of one cell's layer."""
    gates, weight_rows = CELL_LAYOUTS[cell]
    torch.manual_seed(0)
    u = torch.randn(batch, steps, gates * channels, device=dev)
    if cell == "slstm":  # ParaSLSTM's init scale and forget bias (as its tests)
        u /= 3**0.5
        u[..., 2 * channels : 3 * channels] -= 2.0
    weights = [0.25 * (2 * torch.rand(r, channels, device=dev) - 1) for r in weight_rows]
    return u, weights


def copy_bandwidth() -> float:
    src = torch.empty(2**30, device="cuda", dtype=torch.float32)
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src))
    return 2 * src.numel() * 4 / (ms * 1e-3)


def bench_shape(
    batch: int,
    steps: int,
    channels: int,
    bandwidth: float,
    quick: bool,
    kinds: set[str],
    tiles: list[tuple[int, int, int]],
) -> list[dict[str, object]]:
    """Every plan of the fused kernels at one shape; prints a line per case."""
    records: list[dict[str, object]] = []
    dev = torch.device("cuda")
    u, (weight,) = layer_inputs("gru", batch, steps, channels, dev)
    h0 = 0.5 * torch.randn(batch, channels, device=dev)
    floor_ms = 4 * u[..., :channels].numel() * 4 / bandwidth * 1e3
    seq_ms = triton.testing.do_bench(lambda: fused_gru_sequential(u, weight, h0))
    reference = fused_gru_sequential(u, weight, h0)
    for bd, rows, warps, vec in SEQUENTIAL_PLANS if "sequential" in kinds else ():
        plan = dict(block_d=bd, rows=rows, num_warps=warps, vec=vec)
        err = (fused_gru_sequential(u, weight, h0, **plan) - reference).abs().max().item()
        ms = triton.testing.do_bench(lambda plan=plan: fused_gru_sequential(u, weight, h0, **plan))
        print(
            f"  sequential block_d={bd} rows={rows} warps={warps} vec={vec}: {ms:.3f} ms "
            f"({100 * floor_ms / ms:.1f} % of the floor, max diff {err:.1e})"
        )
        records.append(
            dict(
                shape=[batch, steps, channels],
                kind="sequential",
                plan=[bd, rows, warps, vec],
                ms=ms,
                max_abs_diff=err,
            )
        )
    head = f"B={batch} T={steps} D={channels}"
    model = estimate_fused_gru_seconds(batch, steps, channels, dev, torch.float32)
    pick = choose_fused_gru_method(batch, steps, channels, dev, torch.float32)
    print(
        f"{head}: sequential {seq_ms:.3f} ms, floor {floor_ms:.3f} ms; cost model: Newton "
        f"{model['newton'] * 1e3:.3f} ms, sequential {model['sequential'] * 1e3:.3f} ms, "
        f"picks {pick}"
    )
    records.append(dict(shape=[batch, steps, channels], kind="sequential", ms=seq_ms))
    default = plan_fused_gru(batch, steps, channels, dev)

    def run(plan: FusedPlan) -> float | None:
        try:
            ms = triton.testing.do_bench(lambda: fused_gru_newton(u, weight, h0, plan=plan))
            result = fused_gru_newton(u, weight, h0, plan=plan)
        except Exception as exc:  # a plan the hardware refuses (registers, shared memory)
            print(f"  {plan}: failed {type(exc).__name__}: {str(exc)[:120]}")
            return None
        err = (result.states - reference).abs().max().item()
        tag = "default " if plan == default else ""
        print(
            f"  {tag}newton {plan.block_t}x{plan.block_d} S={plan.segments} "
            f"w={plan.num_warps}: {ms:.3f} ms ({seq_ms / ms:.1f}x seq, "
            f"{100 * floor_ms / ms:.0f}% floor) iters {result.iters} passes {result.passes} "
            f"err {err:.1e}"
        )
        records.append(
            dict(
                shape=[batch, steps, channels],
                kind="newton",
                default=plan == default,
                plan=[plan.block_t, plan.block_d, plan.segments, plan.num_warps],
                ms=ms,
                err=err,
                iters=result.iters,
                passes=result.passes,
            )
        )
        return ms

    run(default)
    # Stage 1: tile shapes without segments; stage 2: segments with the best tile.
    newton_tiles = [] if "newton" not in kinds else [(128, 16, 4)] if quick else tiles
    timed = {tile: run(FusedPlan(*tile[:2], 1, tile[2])) for tile in newton_tiles}
    finished = [t for t in timed if timed[t] is not None]
    if finished:
        best = min(finished, key=lambda t: timed[t] or 0.0)
        for segments in (2, 4, 8, 16, 32, 64):
            run(FusedPlan(best[0], best[1], segments, best[2]))

    grad = torch.randn_like(reference)
    bwd_floor = (3 + 1 + 1 + 3) * reference.numel() * 4 / bandwidth * 1e3
    ms = triton.testing.do_bench(lambda: fused_gru_backward(u, weight, h0, reference, grad))
    print(f"  default backward: {ms:.3f} ms ({100 * bwd_floor / ms:.0f}% floor)")
    records.append(dict(shape=[batch, steps, channels], kind="backward", default=True, ms=ms))
    backward_tiles = [] if "backward" not in kinds else [(64, 8, 4)] if quick else tiles
    for bt, bd, warps in backward_tiles:
        ms = triton.testing.do_bench(
            lambda bt=bt, bd=bd, w=warps: fused_gru_backward(
                u, weight, h0, reference, grad, block_t=bt, block_d=bd, num_warps=w
            )
        )
        print(f"  backward {bt}x{bd} w={warps}: {ms:.3f} ms ({100 * bwd_floor / ms:.0f}% floor)")
        records.append(
            dict(shape=[batch, steps, channels], kind="backward", plan=[bt, bd, warps], ms=ms)
        )
    return records


def bench_block_cell(
    cell: str, batch: int, steps: int, channels: int, bandwidth: float, kinds: set[str]
) -> list[dict[str, object]]:
    """ParaLSTM's or ParaSLSTM's default Newton, sequential and backward kernels at one shape
    beside the cost model, and for each of ``kinds`` that kernel over its sweep
    (BLOCK_NEWTON_TILES, BLOCK_SEQUENTIAL_PLANS, BLOCK_BACKWARD_TILES)."""
    dev = torch.device("cuda")
    gates, k = (3, 2) if cell == "lstm" else (4, 3)
    u, weights = layer_inputs(cell, batch, steps, channels, dev)
    run = fused_lstm_sequential if cell == "lstm" else fused_slstm_sequential
    solve = fused_lstm_newton if cell == "lstm" else fused_slstm_newton
    choose = choose_fused_lstm_method if cell == "lstm" else choose_fused_slstm_method
    floor_ms = (gates + k) * batch * steps * channels * 4 / bandwidth * 1e3
    reference = run(u, *weights)
    seq_ms = triton.testing.do_bench(lambda: run(u, *weights))
    result = solve(u, *weights)
    newton_ms = triton.testing.do_bench(lambda: solve(u, *weights))
    estimate = estimate_fused_lstm_seconds if cell == "lstm" else estimate_fused_slstm_seconds
    model = estimate(batch, steps, channels, dev, torch.float32)
    print(
        f"  {cell}: sequential {seq_ms:.3f} ms ({100 * floor_ms / seq_ms:.1f} % of the floor), "
        f"Newton {newton_ms:.3f} ms ({seq_ms / newton_ms:.2f}x, iters {result.iters}, max diff "
        f"{(result.states - reference).abs().max().item():.1e}); cost model: Newton "
        f"{model['newton'] * 1e3:.3f} ms, sequential {model['sequential'] * 1e3:.3f} ms, picks "
        f"{choose(batch, steps, channels, dev, torch.float32)}"
    )
    records: list[dict[str, object]] = [
        dict(shape=[batch, steps, channels], kind=f"{cell}_sequential", default=True, ms=seq_ms),
        dict(shape=[batch, steps, channels], kind=f"{cell}_newton", default=True, ms=newton_ms),
    ]
    for bd, rows, warps, vec in BLOCK_SEQUENTIAL_PLANS if "sequential" in kinds else []:
        plan = dict(block_d=bd, rows=rows, num_warps=warps, vec=vec)
        err = (run(u, *weights, **plan) - reference).abs().max().item()
        ms = triton.testing.do_bench(lambda plan=plan: run(u, *weights, **plan))
        print(
            f"  {cell} sequential {bd} x {rows} warps={warps} vec={vec}: "
            f"{ms:.3f} ms ({100 * floor_ms / ms:.1f} % of the floor, max diff {err:.1e})"
        )
        records.append(
            dict(
                shape=[batch, steps, channels],
                kind=f"{cell}_sequential",
                plan=list(plan.values()),
                ms=ms,
                max_abs_diff=err,
            )
        )
    planner = plan_fused_lstm if cell == "lstm" else plan_fused_slstm
    for bt, bd, warps in BLOCK_NEWTON_TILES if "newton" in kinds else []:
        plan = planner(batch, steps, channels, dev, block_t=bt, block_d=bd, num_warps=warps)
        tiled = solve(u, *weights, plan=plan)
        err = (tiled.states - reference).abs().max().item()
        ms = triton.testing.do_bench(lambda plan=plan: solve(u, *weights, plan=plan))
        print(
            f"  {cell} newton {bt} x {bd} S={plan.segments} warps={warps}: {ms:.3f} ms "
            f"({seq_ms / ms:.2f}x seq, iters {tiled.iters}, max diff {err:.1e})"
        )
        records.append(
            dict(
                shape=[batch, steps, channels],
                kind=f"{cell}_newton",
                plan=[bt, bd, plan.segments, warps],
                ms=ms,
                max_abs_diff=err,
                iters=tiled.iters,
            )
        )
    backward = fused_lstm_backward if cell == "lstm" else fused_slstm_backward
    grad = torch.randn_like(reference)
    # Reads u, the states and their gradient, writes u's gradient.
    bwd_floor = (2 * gates + 2 * k) * batch * steps * channels * 4 / bandwidth * 1e3
    bwd_tiles = BLOCK_BACKWARD_TILES if "backward" in kinds else []
    for tile in [None, *bwd_tiles]:
        shape = (
            {}
            if tile is None
            else dict(zip(("block_t", "block_d", "num_warps"), tile, strict=True))
        )
        ms = triton.testing.do_bench(
            lambda shape=shape: backward(u, *weights, None, reference, grad, **shape)
        )
        name = "default" if tile is None else " x ".join(map(str, tile[:2])) + f" w={tile[2]}"
        print(f"  {cell} backward {name}: {ms:.3f} ms ({100 * bwd_floor / ms:.0f}% floor)")
        records.append(
            dict(
                shape=[batch, steps, channels],
                kind=f"{cell}_backward",
                default=tile is None,
                plan=None if tile is None else list(tile),
                ms=ms,
            )
        )
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, required=True, help="folder for results.json")
    parser.add_argument("--quick", action="store_true", help="fewer plans")
    parser.add_argument(
        "--kinds",
        nargs="*",
        choices=("newton", "backward", "sequential"),
        default=["newton", "backward", "sequential"],
        help="which kernels' launch shapes to sweep (none: the default plans only, which are "
        "always timed)",
    )
    parser.add_argument(
        "--shapes", nargs="+", type=parse_shape, default=SHAPES, help="BxTxD shapes"
    )
    parser.add_argument(
        "--tiles",
        nargs="+",
        type=parse_shape,
        default=TILES,
        metavar="BTxBDxW",
        help="the GRU's Newton and backward tiles to sweep, block_t x block_d x warps "
        "(default: TILES)",
    )
    parser.add_argument(
        "--block-cells",
        nargs="*",
        choices=("lstm", "slstm"),
        default=[],
        help="also time these cells' default kernels (and, for each of --kinds, that kernel "
        "over its sweep: BLOCK_NEWTON_TILES, BLOCK_SEQUENTIAL_PLANS, BLOCK_BACKWARD_TILES)",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    bandwidth = copy_bandwidth()
    print(f"copy bandwidth {bandwidth / 1e9:.0f} GB/s")
    records: list[dict[str, object]] = []
    for batch, steps, channels in args.shapes:
        records += bench_shape(
            batch, steps, channels, bandwidth, args.quick, set(args.kinds), args.tiles
        )
        for cell in args.block_cells:
            records += bench_block_cell(cell, batch, steps, channels, bandwidth, set(args.kinds))
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    payload = dict(date=stamp, bandwidth=bandwidth, records=records)
    (args.out / "results.json").write_text(json.dumps(payload, indent=1))


if __name__ == "__main__":
    main()
