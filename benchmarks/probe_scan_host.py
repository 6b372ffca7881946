"""Where a ``scan_diag`` call's time goes on the GPU: the kernel, and the host around it.

For each shape and storage dtype: the kernel timed back to back (``do_bench``: its L2 flush
between launches, host time hidden behind the GPU), one call of the public ``scan_diag`` under
``no_grad`` timed as ``pararnn-bench`` times a call (``time_call_ms``: a 256 MiB L2 flush, CUDA
events around the call, a synchronize after it) and its host (CPU) time, medians of 30, and the
host time of the launcher ``triton_scan_diag`` alone, the mean of 50 calls issued back to back.
Both times also as a fraction of the byte floor (jac and rhs read once, y written once, over the
copy bandwidth measured at the start). Needs a CUDA GPU::

    python3 benchmarks/probe_scan_host.py
    python3 benchmarks/probe_scan_host.py --dtype fp32 bf16 --shape 8x4096x1536 --shape 64x4096x1024
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import torch
import triton
import triton.testing

from pararnn_examples.bench import Shape, parse_shape
from pararnn_examples.bench.measure import l2_flush_buffer, time_call_ms
from pararnn_kernels import scan_diag
from pararnn_kernels.scan import launch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
#: The shapes of the first probe (2026-12-04), each with its storage dtype.
DEFAULT_CASES = [
    ("bf16", Shape(8, 4096, 1536)),
    ("fp32", Shape(8, 4096, 1536)),
    ("fp32", Shape(1, 65536, 256)),
    ("bf16", Shape(8, 16384, 256)),
]


def copy_bytes_per_s(device: torch.device) -> float:
    """Bytes read plus written per second by a 256 MiB device-to-device copy."""
    src = torch.empty(2**28, device=device, dtype=torch.uint8)
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=10, rep=50, return_mode="median")
    return 2 * src.numel() / (ms * 1e-3)


def _public_call(jac: torch.Tensor, rhs: torch.Tensor, host_ms: list[float]) -> None:
    """One public ``scan_diag`` call under ``no_grad``; appends its host milliseconds."""
    t0 = time.perf_counter()
    with torch.no_grad():
        scan_diag(jac, rhs, backend="triton")
    host_ms.append((time.perf_counter() - t0) * 1e3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", type=parse_shape, action="append", help="BxTxD (repeatable)")
    parser.add_argument("--dtype", nargs="+", choices=sorted(DTYPES), default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("probe_scan_host.py needs a CUDA GPU")
    dev = torch.device("cuda")
    if args.shape or args.dtype:
        cases = [
            (dt, s) for dt in args.dtype or ["fp32"] for s in args.shape or [DEFAULT_CASES[0][1]]
        ]
    else:
        cases = DEFAULT_CASES
    flush = l2_flush_buffer(dev)
    bandwidth = copy_bytes_per_s(dev)
    print(f"copy bandwidth {bandwidth / 1e9:.0f} GB/s", flush=True)
    for name, (b, t, d) in cases:
        dtype = DTYPES[name]
        jac = (torch.rand(b, t, d, device=dev) * 1.8 - 0.9).to(dtype)
        rhs = torch.randn(b, t, d, device=dev).to(dtype)
        floor_ms = 3 * jac.numel() * jac.element_size() / bandwidth * 1e3
        launcher = functools.partial(launch.triton_scan_diag, jac, rhs, None, reverse=False)
        kernel_ms = triton.testing.do_bench(launcher, warmup=10, rep=60, return_mode="median")
        host: list[float] = []
        call = functools.partial(_public_call, jac, rhs, host)
        for _ in range(5):
            call()
        host.clear()
        synced = statistics.median(time_call_ms(call, dev, flush) for _ in range(30))
        # The launcher's host time: the mean of 50 calls issued back to back.
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(50):
            launcher()
        host_launcher_ms = (time.perf_counter() - t0) / 50 * 1e3
        torch.cuda.synchronize()
        plan = launch.plan_scan_diag(b, t, d, dev, dtype=dtype)
        print(
            f"{name} {(b, t, d)} {plan.method}: floor {floor_ms * 1e3:.1f} us; kernel back to "
            f"back {kernel_ms * 1e3:.1f} us ({floor_ms / kernel_ms:.1%}); call as pararnn-bench "
            f"{synced * 1e3:.1f} us ({floor_ms / synced:.1%}); host of scan_diag "
            f"{statistics.median(host) * 1e3:.1f} us, of the launcher {host_launcher_ms * 1e3:.1f} us",
            flush=True,
        )


if __name__ == "__main__":
    main()
