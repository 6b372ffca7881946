"""Time segments of the fused Newton kernels: eager calls, CUDA-graph replays and host time.

For each cell and shape, at 1-32 segments: the median ms of an eager call
(``triton.testing.do_bench``), of a replay of the call captured in a CUDA graph (the kernel
alone: the segments are chained on the device, so a segmented call captures) and the host's
ms per call (50 calls back to back, before the GPU is waited for). The inputs are
bench_fused.py's. Prints one JSON line per (cell, shape): ``"S<n>": [eager, graph, host]``.

    cd benchmarks && python3 segment_graphs.py
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from typing import Any

import torch
import triton.testing
from bench_fused import layer_inputs

from pararnn_kernels import fused

#: cell -> (Newton, planner)
CELLS: dict[str, tuple[Any, Any]] = {
    "gru": (fused.fused_gru_newton, fused.plan_fused_gru),
    "lstm": (fused.fused_lstm_newton, fused.plan_fused_lstm),
    "slstm": (fused.fused_slstm_newton, fused.plan_fused_slstm),
}
SHAPES = [
    (1, 4096, 256),
    (1, 16384, 256),
    (1, 65536, 256),
    (1, 65536, 64),
    (8, 4096, 256),
    (4, 16384, 256),
]
COUNTS = (1, 2, 4, 8, 16, 32)


def host_ms(fn: Callable[[], Any], calls: int = 50) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e3


def graph_ms(fn: Callable[[], Any]) -> float:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()  # warm-up off the capture stream
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return float(triton.testing.do_bench(graph.replay))


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("segment_graphs.py needs a CUDA GPU")
    dev = torch.device("cuda")
    for cell, (newton, planner) in CELLS.items():
        for b, t, d in SHAPES:
            u, weights = layer_inputs(cell, b, t, d, dev)
            row: dict[str, Any] = dict(cell=cell, shape=[b, t, d])
            row["default"] = planner(b, t, d, dev).segments
            for count in COUNTS:
                call = functools.partial(
                    newton, u, *weights, plan=planner(b, t, d, dev, segments=count)
                )
                call()
                eager = float(triton.testing.do_bench(call))
                host = host_ms(call)
                times = [eager, graph_ms(call), host]
                row[f"S{count}"] = [round(x, 4) for x in times]
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
