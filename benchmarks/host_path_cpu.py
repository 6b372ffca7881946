"""The Python host path of one ``scan_diag`` call, measured on a machine without a GPU.

A scan call's host time (validation, the autograd function, the plan, the allocations, the
relaunch key) is what the GPU waits for at moderate sizes (docs/benchmarks.md), and GPU time is
scarce. This runs the public ``scan_diag`` on CPU tensors under ``TRITON_INTERPRET=1`` with
the launches going through :class:`pararnn_kernels._launch._Relauncher` itself, over kernels
that "compile" to no-ops, so every launch after the first takes the relauncher's hit path (the
launch key, the lookup, the arguments in signature order, the call of the compiled kernel) and
the time left is the library's own Python and torch ops. CPU tensor ops are cheaper than CUDA
ones and the CI machine's Python is 3-10x faster than the GPU hosts', so compare
trees on one machine, not absolute figures with a GPU's::

    python3 benchmarks/host_path_cpu.py --shape 1x32x64
    python3 benchmarks/host_path_cpu.py --profile 25      # cProfile of forward+backward

Medians over rounds of back-to-back calls, µs per call: the forward under ``no_grad``, with
gradients, forward+backward, the look-back launcher alone, and an empty autograd function's
forward+backward (the floor any differentiable op pays).
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before the kernel modules are imported

import argparse
import cProfile
import pstats
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from pararnn_examples.bench import Shape, parse_shape
from pararnn_kernels import _launch, scan_diag
from pararnn_kernels.scan import launch


class _Compiled:
    """Stands in for a compiled kernel: the relauncher keeps it and launches it (a no-op)."""

    function = None

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        return lambda *args: None


class _Uncompiled:
    """Stands in for a ``@triton.jit`` kernel: its first launch "compiles" to :class:`_Compiled`."""

    def __init__(self, kernel: Any) -> None:
        self.arg_names = kernel.arg_names

    def __getitem__(self, grid: Any) -> Callable[..., _Compiled]:
        return lambda *args, **kwargs: _Compiled()


def install_stand_ins() -> None:
    """Route every scan launch of this process through a real relauncher whose kernels compile
    to no-ops, so every launch after the first takes the relauncher's own hit path (device 0
    for the key)."""
    relaunchers: dict[Any, _launch._Relauncher] = {}

    def launchable(kernel: Any) -> _launch._Relauncher:
        if kernel not in relaunchers:
            relaunchers[kernel] = _launch._Relauncher(_Uncompiled(kernel))
        return relaunchers[kernel]

    launch.launchable = launchable  # type: ignore[assignment]
    torch.cuda.current_device = lambda: 0


class _Empty(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, jac: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(rhs)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.empty_like(grad), torch.empty_like(grad)


def per_call_us(fn: Callable[[], object], calls: int, rounds: int = 7) -> float:
    """Median over ``rounds`` of the mean time of ``calls`` back-to-back calls, in µs."""
    for _ in range(max(calls // 10, 10)):
        fn()
    means = []
    for _ in range(rounds):
        begin = time.perf_counter()
        for _ in range(calls):
            fn()
        means.append((time.perf_counter() - begin) / calls * 1e6)
    return statistics.median(means)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shape", type=parse_shape, default=Shape(1, 32, 64), help="BxTxD")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="cProfile top N")
    args = parser.parse_args()
    install_stand_ins()
    shape = tuple(args.shape)
    jac = (0.9 * torch.rand(*shape)).requires_grad_()
    rhs = torch.randn(*shape).requires_grad_()
    cotangent = torch.randn(*shape)

    def forward_no_grad() -> None:
        with torch.no_grad():
            scan_diag(jac, rhs, backend="triton")

    def forward() -> None:
        scan_diag(jac, rhs, backend="triton")

    def forward_backward() -> None:
        jac.grad = rhs.grad = None
        torch.autograd.backward(scan_diag(jac, rhs, backend="triton"), cotangent)

    def empty_forward_backward() -> None:
        jac.grad = rhs.grad = None
        torch.autograd.backward(_Empty.apply(jac, rhs), cotangent)

    plan = launch.plan_scan_diag(*shape, jac.device, dtype=jac.dtype)
    out = torch.empty_like(rhs)
    detached = (jac.detach(), rhs.detach())

    def launcher() -> None:
        launch._launcher(plan)(*detached, None, out, plan, reverse=False, shift=False)

    print(f"scan_diag host path on the CPU, fp32 {shape}, plan {plan.method}; µs per call")
    for name, fn in (
        ("forward, no_grad", forward_no_grad),
        ("forward, with grad", forward),
        ("forward+backward", forward_backward),
        ("the plan's launcher alone", launcher),
        ("empty autograd function, forward+backward", empty_forward_backward),
    ):
        print(f"  {name:44s} {per_call_us(fn, args.calls):7.1f}", flush=True)
    if args.profile:
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(args.calls):
            forward_backward()
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(args.profile)


if __name__ == "__main__":
    main()
