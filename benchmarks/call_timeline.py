"""The timeline of one timed scan call: ours against accelerated-scan's, on the profiler.

On one CUDA GPU: ``scan_diag`` (Triton) and, when it imports, accelerated-scan's
``accelerated_scan.scalar.scan`` (its layout ``[B, D, T]``, converted outside the timed call) at
one shape, forward under ``no_grad`` or (``--backward``) forward+backward with a fixed cotangent.
Each is timed as ``pararnn-bench`` times a call (``time_call_ms``: a 256 MiB L2 flush, CUDA
events, a synchronize; median of 30), then three such calls run under ``torch.profiler`` and the
last one's events are printed from the flush kernel's start: host-side ops and CUDA runtime calls
(when the host asked) and GPU kernels (when the GPU ran them), in µs. The gap between the start
event and a scan kernel's start is the host time the GPU waits for::

    python3 benchmarks/call_timeline.py --shape 8x4096x1536 --backward
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from pararnn_examples.bench import Shape, parse_shape
from pararnn_examples.bench.measure import l2_flush_buffer, time_call_ms
from pararnn_kernels import scan_diag

_SHOWN = ("kernel", "cuda_runtime", "cuda_driver", "gpu_memset", "cpu_op")


def _calls(shape: Shape, backward: bool, dev: torch.device) -> dict[str, Callable[[], None]]:
    batch, steps, width = shape
    jac = (torch.rand(batch, steps, width, device=dev) * 1.8 - 0.9).requires_grad_()
    rhs = torch.randn(batch, steps, width, device=dev).requires_grad_()
    cotangent = torch.randn(batch, steps, width, device=dev)

    def ours() -> None:
        if backward:
            jac.grad = None
            rhs.grad = None
            torch.autograd.backward(scan_diag(jac, rhs, backend="triton"), cotangent)
        else:
            with torch.no_grad():
                scan_diag(jac, rhs, backend="triton")

    calls = {"scan_diag": ours}
    try:
        from accelerated_scan.scalar import scan as peer_scan
    except ImportError as error:
        print(f"accelerated-scan skipped: {error}")
        return calls
    gates = jac.detach().transpose(1, 2).contiguous().requires_grad_()
    tokens = rhs.detach().transpose(1, 2).contiguous().requires_grad_()
    peer_cotangent = cotangent.transpose(1, 2).contiguous()

    def peer() -> None:
        if backward:
            gates.grad = None
            tokens.grad = None
            torch.autograd.backward(peer_scan(gates, tokens), peer_cotangent)
        else:
            with torch.no_grad():
                peer_scan(gates, tokens)

    calls["accelerated_scan"] = peer
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", type=parse_shape, default=Shape(8, 4096, 1536), help="BxTxD")
    parser.add_argument("--backward", action="store_true", help="time forward+backward")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("call_timeline.py needs a CUDA GPU")
    dev = torch.device("cuda")
    torch.manual_seed(0)
    flush = l2_flush_buffer(dev)
    assert flush is not None
    for name, fn in _calls(args.shape, args.backward, dev).items():
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
        median = statistics.median(time_call_ms(fn, dev, flush) for _ in range(30))
        print(f"{name}: {median:.3f} ms per call as pararnn-bench times it")
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                time_call_ms(fn, dev, flush)
        trace = Path(tempfile.mkdtemp()) / "timeline.json"
        prof.export_chrome_trace(str(trace))
        events = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("ph") == "X"]
        events.sort(key=lambda e: e["ts"])
        # The last call starts with the last flush (the only fill kernel that long).
        fills = [e for e in events if e.get("cat") == "kernel" and "Fill" in e["name"]]
        start = [e for e in fills if e["dur"] > 20][-1]["ts"]
        for e in events:
            if e["ts"] >= start - 100 and e.get("cat") in _SHOWN:
                print(f"  {e['ts'] - start:9.1f} {e['dur']:8.1f}  {e['cat']:12s} {e['name'][:70]}")


if __name__ == "__main__":
    main()
