"""Where a small ``scan_diag`` call's time goes on the GPU.

For each shape: the kernel timed back to back (``do_bench``: host time hidden behind the GPU),
one call of the public ``scan_diag`` under ``no_grad`` timed by CUDA events with a synchronize
after it (as ``pararnn-bench`` times single calls) and its host (CPU) time, medians of 50, and
the host time of the launcher ``triton_scan_diag`` alone, the mean of 50 calls issued back to
back. Needs a CUDA GPU::

    python3 benchmarks/probe_scan_host.py
"""

from __future__ import annotations

import functools
import statistics
import time

import torch
import triton

from pararnn_kernels import scan_diag
from pararnn_kernels.scan import launch

SHAPES = [
    (torch.bfloat16, (8, 4096, 1536)),
    (torch.float32, (8, 4096, 1536)),
    (torch.float32, (1, 65536, 256)),
    (torch.bfloat16, (8, 16384, 256)),
]


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("probe_scan_host.py needs a CUDA GPU")
    dev = torch.device("cuda")
    for dtype, (b, t, d) in SHAPES:
        jac = (torch.rand(b, t, d, device=dev) * 1.8 - 0.9).to(dtype)
        rhs = torch.randn(b, t, d, device=dev).to(dtype)
        launcher = functools.partial(launch.triton_scan_diag, jac, rhs, None, reverse=False)
        kernel_ms = triton.testing.do_bench(launcher, warmup=20, rep=100, return_mode="median")
        synced, host = [], []
        with torch.no_grad():
            for _ in range(10):
                scan_diag(jac, rhs, backend="triton")
            for _ in range(50):
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                t0 = time.perf_counter()
                scan_diag(jac, rhs, backend="triton")
                host.append(time.perf_counter() - t0)
                end.record()
                end.synchronize()
                synced.append(start.elapsed_time(end))
            # The launcher's host time: the mean of 50 calls issued back to back.
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(50):
                launcher()
            host_launcher = (time.perf_counter() - t0) / 50
            torch.cuda.synchronize()
        plan = launch.plan_scan_diag(b, t, d, dev, dtype=dtype)
        print(
            f"{dtype} {(b, t, d)} {plan}: kernel back to back {kernel_ms * 1e3:.1f} us, "
            f"synced call {statistics.median(synced) * 1e3:.1f} us, host of scan_diag "
            f"{statistics.median(host) * 1e6:.1f} us, host of the launcher "
            f"{host_launcher * 1e6:.1f} us",
            flush=True,
        )


if __name__ == "__main__":
    main()
