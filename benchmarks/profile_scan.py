"""A few launches of one diagonal scan plan, as the target of an outside profiler.

On one CUDA GPU: ``--calls`` launches of ``triton_scan_diag`` (or its adjoint with
``--adjoint``) at one shape and storage dtype, with the default plan or the one the overrides
give, then a synchronize; it prints the plan. For comparing the look-back kernels with the
chunked pass (no look-back) under the same profiler sections, e.g.::

    ncu --clock-control none -k regex:scan_diag -s 2 -c 1 --section SpeedOfLight \\
        --section MemoryWorkloadAnalysis --section SchedulerStats --section Occupancy \\
        python3 benchmarks/profile_scan.py --shape 8x65536x512 --dtype bf16
    ncu ... python3 benchmarks/profile_scan.py --shape 8x65536x512 --dtype bf16 --method chunked
"""

from __future__ import annotations

import argparse

import torch

from pararnn_examples.bench import Shape, parse_shape
from pararnn_kernels.scan import launch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", type=parse_shape, default=Shape(8, 65536, 512), help="BxTxD")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--method", choices=["chunked", "lookback", "tiles", "twopass"])
    parser.add_argument("--block-t", type=int, default=None)
    parser.add_argument("--block-d", type=int, default=None)
    parser.add_argument("--rows", type=int, default=None)
    parser.add_argument("--num-warps", type=int, default=None)
    parser.add_argument("--window", type=int, default=None)
    parser.add_argument("--adjoint", action="store_true", help="launch the adjoint pass")
    parser.add_argument("--calls", type=int, default=3)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("profile_scan.py needs a CUDA GPU")
    dev = torch.device("cuda")
    dtype = DTYPES[args.dtype]
    batch, steps, channels = args.shape
    jac = (torch.rand(batch, steps, channels, device=dev) * 1.8 - 0.9).to(dtype)
    rhs = torch.randn(batch, steps, channels, device=dev).to(dtype)
    overrides = {
        name: value
        for name, value in (
            ("method", args.method),
            ("block_t", args.block_t),
            ("block_d", args.block_d),
            ("rows", args.rows),
            ("num_warps", args.num_warps),
            ("window", args.window),
        )
        if value is not None
    }
    plan = launch.plan_scan_diag(
        batch, steps, channels, dev, dtype=dtype, adjoint=args.adjoint, **overrides
    )
    print(f"{args.dtype} {tuple(args.shape)} {'adjoint' if args.adjoint else 'forward'}: {plan}")
    y = launch.triton_scan_diag(jac, rhs, None, reverse=False, **overrides)
    grad_y = torch.randn_like(y)
    for _ in range(args.calls):
        if args.adjoint:
            launch.triton_scan_diag_adjoint(jac, y, None, grad_y, reverse=False, **overrides)
        else:
            launch.triton_scan_diag(jac, rhs, None, reverse=False, **overrides)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
