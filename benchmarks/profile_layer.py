"""Where a ParaGRU layer's forward+backward goes: its GPU kernels and the gaps between them.

On one CUDA GPU: one fp32 ParaGRU layer (``scan_backend="fused"``) forward+backward, after a
256 MiB L2 flush (as pararnn-bench times a call), under ``torch.profiler``; prints each GPU
kernel of the last call with its start (µs after the flush's start) and duration, the busy time
and the span, and writes the Chrome trace (``--trace FILE``) for the host side::

    python3 benchmarks/profile_layer.py --shape 8x4096x256 --trace /tmp/layer.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
from host_calls import gru_layer_calls  # the same layer and calls, from this folder
from torch.profiler import ProfilerActivity, profile

from pararnn_examples.bench import Shape, parse_shape
from pararnn_examples.bench.measure import l2_flush_buffer

_GPU_EVENTS = ("kernel", "gpu_memcpy", "gpu_memset")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", type=parse_shape, default=Shape(8, 4096, 256), help="BxTxD")
    parser.add_argument("--trace", type=Path, default=None, help="write the Chrome trace here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("profile_layer.py needs a CUDA GPU")
    dev = torch.device("cuda")
    torch.manual_seed(0)
    _, forward_backward = gru_layer_calls(dev, args.shape)
    flush = l2_flush_buffer(dev)
    assert flush is not None

    for _ in range(5):
        forward_backward()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            flush.zero_()
            forward_backward()
            torch.cuda.synchronize()
    trace = args.trace or Path(tempfile.mkdtemp()) / "layer.json"
    prof.export_chrome_trace(str(trace))
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("ph") == "X"]
    gpu = sorted((e for e in events if e.get("cat") in _GPU_EVENTS), key=lambda e: e["ts"])
    # The last call starts with the last flush (the only fill that long).
    flushes = [e for e in gpu if "Fill" in e["name"] and e["dur"] > 20]
    start = flushes[-1]["ts"]
    last = [e for e in gpu if e["ts"] >= start]
    for e in last:
        print(f"{e['ts'] - start:9.1f} us  {e['dur']:8.1f} us  {e['name'][:90]}")
    busy = sum(e["dur"] for e in last[1:])
    span = last[-1]["ts"] + last[-1]["dur"] - start
    print(f"busy {busy:.1f} us besides the flush, span {span:.1f} us from the flush's start")
    print(f"Chrome trace: {trace}")


if __name__ == "__main__":
    main()
