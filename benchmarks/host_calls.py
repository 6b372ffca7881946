"""Host-bound calls, timed as pararnn-bench times one call: for comparing two trees in one run.

On one CUDA GPU: ``scan_diag`` forward (under ``no_grad``) and forward+backward at
(8, 4096, 1536) in fp32 and bf16, and a ParaGRU layer (``scan_backend="fused"``) forward and
forward+backward at (8, 4096, 256) in fp32. Each call is timed with a 256 MiB L2 flush before
it and CUDA events around it, synchronized after it; its host time by ``perf_counter``. Medians
of 30 calls after 5 warm-up calls. Which tree runs is ``PYTHONPATH``'s choice, so two trees
compare by alternating runs in one session::

    git archive <rev> packages | tar -x -C /tmp/old
    for tree in /tmp/old $PWD /tmp/old $PWD; do
        PYTHONPATH=$(ls -d $tree/packages/*/src | paste -sd:) python3 benchmarks/host_calls.py
    done
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

import pararnn_core as pc
import pararnn_kernels
from pararnn_kernels import scan_diag

FLUSH_BYTES = 256 * 2**20


def timed(fn: Callable[[], object], flush: torch.Tensor, calls: int = 30) -> tuple[float, float]:
    """Median ms per synchronized call and median host ms, as ``pararnn-bench`` times a call."""
    synced, host = [], []
    for _ in range(calls):
        flush.zero_()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t0) * 1e3)
        end.record()
        end.synchronize()
        synced.append(start.elapsed_time(end))
    return statistics.median(synced), statistics.median(host)


def scan_calls(dtype: torch.dtype, dev: torch.device) -> list[tuple[str, Callable[[], None]]]:
    shape = (8, 4096, 1536)
    jac = (torch.rand(*shape, device=dev) * 1.8 - 0.9).to(dtype).requires_grad_()
    rhs = torch.randn(*shape, device=dev).to(dtype).requires_grad_()
    cotangent = torch.randn(*shape, device=dev).to(dtype)

    def forward() -> None:
        with torch.no_grad():
            scan_diag(jac, rhs, backend="triton")

    def forward_backward() -> None:
        jac.grad = None
        rhs.grad = None
        torch.autograd.backward(scan_diag(jac, rhs, backend="triton"), cotangent)

    name = f"scan_diag {dtype} (8, 4096, 1536)"
    return [(f"{name} fwd, no_grad", forward), (f"{name} fwd+bwd", forward_backward)]


def layer_calls(dev: torch.device) -> list[tuple[str, Callable[[], None]]]:
    cell = pc.ParaGRU(256, 256).to(dev)
    x = torch.randn(8, 4096, 256, device=dev, requires_grad=True)
    cotangent = torch.randn(8, 4096, 256, device=dev)
    config = pc.NewtonConfig(scan_backend="fused")
    params = list(cell.parameters())

    def forward() -> None:
        with torch.no_grad():
            pc.newton_apply(cell, x, config=config)

    def forward_backward() -> None:
        for p in params:
            p.grad = None
        x.grad = None
        states, _ = pc.newton_apply(cell, x, config=config)
        torch.autograd.backward(cell.output(states), cotangent)

    name = "ParaGRU layer fp32 (8, 4096, 256)"
    return [(f"{name} fwd, no_grad", forward), (f"{name} fwd+bwd", forward_backward)]


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("host_calls.py needs a CUDA GPU")
    dev = torch.device("cuda")
    torch.manual_seed(0)
    print(f"pararnn_kernels from {pararnn_kernels.__file__}", flush=True)
    flush = torch.empty(FLUSH_BYTES // 4, device=dev)
    calls = [
        *scan_calls(torch.float32, dev),
        *scan_calls(torch.bfloat16, dev),
        *layer_calls(dev),
    ]
    for name, fn in calls:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        ms, host_ms = timed(fn, flush)
        print(f"{name}: {ms:.3f} ms per synced call, host {host_ms:.3f} ms", flush=True)


if __name__ == "__main__":
    main()
