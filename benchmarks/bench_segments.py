"""Time segments and short sequences of the fused kernels (the numbers behind their cost model).

Times, on one CUDA GPU, each cell's fused Newton kernel at every power-of-two segment count
(``--segments``; the default plan's count is printed beside) and, with ``--short``, Newton, the
sequential kernel and the backward at B = 8, d = 256, T = 256-4096 in rounds with the cells
interleaved (the first calls of a process are slow to settle). Every Newton result is checked
against the sequential kernel (max abs difference recorded); the inputs are bench_fused.py's.

    python3 benchmarks/bench_segments.py --out OUT/seg --short
    python3 benchmarks/bench_segments.py --out OUT/seg --shapes 1x65536x256 2x16384x256 \
        --segments 1 4 8 16 32
"""

from __future__ import annotations

import argparse
import json
import pathlib
from collections.abc import Callable
from typing import Any

import torch
import triton.testing
from bench_fused import layer_inputs

from pararnn_examples.bench import parse_shape
from pararnn_kernels import fused

#: cell -> (Newton, sequential, planner, backward)
CELLS: dict[str, tuple[Any, ...]] = {
    "gru": (fused.fused_gru_newton, fused.fused_gru_sequential, fused.plan_fused_gru,
            fused.fused_gru_backward),
    "lstm": (fused.fused_lstm_newton, fused.fused_lstm_sequential, fused.plan_fused_lstm,
             fused.fused_lstm_backward),
    "slstm": (fused.fused_slstm_newton, fused.fused_slstm_sequential, fused.plan_fused_slstm,
              fused.fused_slstm_backward),
}  # fmt: skip
SHAPES = [
    (1, 4096, 256),
    (1, 16384, 256),
    (2, 16384, 256),
    (4, 16384, 256),
    (1, 32768, 256),
    (1, 65536, 256),
    (1, 65536, 64),
    (1, 16384, 1024),
]


def timed(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> float:
    """Median ms of ``fn(*args, **kwargs)`` (``triton.testing.do_bench``)."""
    return float(triton.testing.do_bench(lambda: fn(*args, **kwargs)))


def short_rounds(dev: torch.device, rounds: int) -> list[dict[str, Any]]:
    records = []
    for rnd in range(rounds):
        for t in (256, 512, 1024, 4096):
            for cell, (newton, seq, _plan, bwd) in CELLS.items():
                u, ws = layer_inputs(cell, 8, t, 256, dev)
                states = seq(u, *ws)
                grad = torch.randn_like(states)
                row: dict[str, Any] = dict(round=rnd, cell=cell, shape=[8, t, 256])
                row["sequential"] = timed(seq, u, *ws)
                row["newton"] = timed(newton, u, *ws)
                row["backward"] = timed(bwd, u, *ws, None, states, grad)
                print(json.dumps(row), flush=True)
                records.append(row)
    return records


def segment_counts(
    dev: torch.device, shapes: list[tuple[int, int, int]], counts: list[int]
) -> list[dict[str, Any]]:
    records = []
    for cell, (newton, seq, planner, _bwd) in CELLS.items():
        for b, t, d in shapes:
            u, ws = layer_inputs(cell, b, t, d, dev)
            reference = seq(u, *ws)
            row: dict[str, Any] = dict(cell=cell, shape=[b, t, d])
            row["default"] = planner(b, t, d, dev).segments
            row["sequential"] = timed(seq, u, *ws)
            for s in sorted(set(counts) | {row["default"]}):
                plan = planner(b, t, d, dev, segments=s)
                result = newton(u, *ws, plan=plan)
                row[f"err{s}"] = (result.states - reference).abs().max().item()
                row[f"S{s}"] = timed(newton, u, *ws, plan=plan)
            print(json.dumps(row), flush=True)
            records.append(row)
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, required=True, help="folder for results.json")
    parser.add_argument("--short", action="store_true", help="the short-sequence rounds only")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of --short")
    parser.add_argument(
        "--shapes", nargs="+", type=parse_shape, default=SHAPES, help="BxTxD shapes"
    )
    parser.add_argument(
        "--segments", nargs="+", type=int, default=[1, 8], help="segment counts timed"
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_segments.py needs a CUDA GPU")
    dev = torch.device("cuda")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.short:
        records = short_rounds(dev, args.rounds)
    else:
        records = segment_counts(dev, args.shapes, args.segments)
    (args.out / "results.json").write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
