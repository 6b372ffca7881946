"""Where one fused Newton call's time goes: the whole call against the kernel inside it.

On one CUDA GPU, for the fused GRU kernels on given inputs ``u [B, T, 3D]``: times the fused
sequential kernel and the fused Newton call (``triton.testing.do_bench``), then lists the CUDA
and CPU time of ten Newton calls by operator (``torch.profiler``), so the kernel's share of a call
and the host work around it show. With ``--kernel-only`` it only runs three Newton calls, for an
outside profiler:

    python3 benchmarks/profile_fused.py --shape 8x4096x256
    ncu --clock-control none -k regex:gru_newton -c 1 --section SpeedOfLight \\
        --section WarpStateStats --section Occupancy --section LaunchStats \\
        python3 benchmarks/profile_fused.py --shape 8x4096x256 --kernel-only
"""

from __future__ import annotations

import argparse

import torch
import triton.testing
from torch.profiler import ProfilerActivity, profile

from pararnn_examples.bench import Shape, parse_shape
from pararnn_kernels.fused import fused_gru_newton, fused_gru_sequential, plan_fused_gru


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", type=parse_shape, default=Shape(8, 4096, 256), help="BxTxD")
    parser.add_argument("--kernel-only", action="store_true", help="three calls, no timing")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    batch, steps, width = args.shape
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    u = torch.randn(batch, steps, 3 * width, device=dev, generator=gen)
    weight = 0.25 * (2 * torch.rand(3, width, device=dev, generator=gen) - 1)
    h0 = 0.5 * torch.randn(batch, width, device=dev, generator=gen)

    def newton() -> object:
        return fused_gru_newton(u, weight, h0)

    if args.kernel_only:
        for _ in range(3):
            newton()
        torch.cuda.synchronize()
        return
    print(f"shape B={batch} T={steps} D={width}, plan {plan_fused_gru(batch, steps, width, dev)}")
    reference = fused_gru_sequential(u, weight, h0)
    result = fused_gru_newton(u, weight, h0)
    error = (result.states - reference).abs().max().item()
    print(f"Newton: {result.iters} iterations, max |Newton - sequential| {error:.2e}")
    sequential_ms = triton.testing.do_bench(lambda: fused_gru_sequential(u, weight, h0))
    newton_ms = triton.testing.do_bench(newton)
    print(f"fused sequential {sequential_ms:.4f} ms, fused Newton call {newton_ms:.4f} ms")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            newton()
        torch.cuda.synchronize()
    print("ten Newton calls by operator:")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=15))


if __name__ == "__main__":
    main()
