"""Newton's initial guesses against each other, in the fused kernels of every cell.

Times, on one CUDA GPU, ``fused_{gru,lstm,slstm}_newton`` on the projected inputs of
``bench_fused.layer_inputs`` with each ``initial_guess`` back to back (default plans, default
tolerance and ``max_iters``), and prints per row the milliseconds (``triton.testing.do_bench``
median), the most updates any chunk ran, the largest residual a chunk stopped at and the max
difference from the fused sequential kernel's states::

    python3 benchmarks/bench_guess.py
    python3 benchmarks/bench_guess.py --shapes 8x4096x256 --guesses step uncoupled --dtypes fp32
"""

from __future__ import annotations

import argparse
import functools

import torch
import triton.testing
from bench_fused import layer_inputs

from pararnn_examples.bench import parse_shape
from pararnn_kernels import fused

CELLS = {
    "gru": (fused.fused_gru_newton, fused.fused_gru_sequential),
    "lstm": (fused.fused_lstm_newton, fused.fused_lstm_sequential),
    "slstm": (fused.fused_slstm_newton, fused.fused_slstm_sequential),
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shapes",
        nargs="+",
        type=parse_shape,
        default=[(8, 4096, 256), (8, 16384, 256), (1, 65536, 256), (64, 4096, 1024)],
    )
    parser.add_argument("--cells", nargs="+", choices=sorted(CELLS), default=list(CELLS))
    parser.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), default=["fp32", "bf16"])
    parser.add_argument(
        "--guesses",
        nargs="+",
        choices=["step", "initial_state", "uncoupled"],
        default=["step", "uncoupled"],
    )
    args = parser.parse_args()
    dev = torch.device("cuda")
    print(torch.cuda.get_device_name(dev))
    for shape in args.shapes:
        for cell in args.cells:
            newton, sequential = CELLS[cell]
            for dtype_name in args.dtypes:
                u, weights = layer_inputs(cell, *shape, dev)
                u = u.to(DTYPES[dtype_name])
                reference = sequential(u, *weights, None).float()
                line = f"{cell} {shape} {dtype_name}"
                for guess in args.guesses:
                    call = functools.partial(newton, u, *weights, None, initial_guess=guess)
                    result = call()
                    err = (result.states.float() - reference).abs().max().item()
                    ms = triton.testing.do_bench(call, warmup=20, rep=100)
                    line += (
                        f" | {guess} {ms:.4f} ms iters {result.iters} "
                        f"res {result.max_residual:.1e} err {err:.1e}"
                    )
                print(line, flush=True)


if __name__ == "__main__":
    main()
