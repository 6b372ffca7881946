"""Where the host time of a fused ParaGRU layer's forward+backward goes, call by call.

On one CUDA GPU: the fp32 ParaGRU layer of ``host_calls.py`` (``scan_backend="fused"``, x ->
states, backward with a fixed cotangent) at B = 8, d = 256 and each ``--steps``, with matmul and
cuDNN TF32 off and then on. Each call is timed as ``pararnn-bench`` times it (a 256 MiB L2 flush,
CUDA events, a synchronize) and split on the host by ``perf_counter`` marks around the fused
Newton launcher (which ends in the solve's one host sync, the stats read-back) and the fused
backward launcher: ``pre`` (call start to the Newton launcher: input checks, the projection's
launch), ``newton`` (the launcher, including the wait for the GPU), ``mid`` (the rest of the
forward and autograd up to the backward launcher), ``bwd`` (the backward launcher), ``post``
(the projection's backward and autograd's return). Medians of 30::

    python3 benchmarks/layer_host_split.py --steps 4096 16384

With ``--profile``, also ``cProfile``'s top functions by own time over 50 synchronized calls at
the first ``--steps``.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import pstats
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from host_calls import gru_layer_calls  # the same layer and calls, from this folder

from pararnn_examples.bench import Shape
from pararnn_examples.bench.measure import l2_flush_buffer, time_call_ms
from pararnn_kernels.fused import gru as fused_gru

_PARTS = ("pre", "newton", "mid", "bwd", "post")


def _marked(marks: dict[str, float], name: str, fn: Any) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        marks[f"{name}_in"] = time.perf_counter()
        result = fn(*args, **kwargs)
        marks[f"{name}_out"] = time.perf_counter()
        return result

    return wrapper


def _split_call(
    forward_backward: Callable[[], None], marks: dict[str, float], rows: dict[str, list[float]]
) -> None:
    """One forward+backward; appends its host milliseconds and their split to ``rows``."""
    t0 = time.perf_counter()
    forward_backward()
    t1 = time.perf_counter()
    rows["host_ms"].append((t1 - t0) * 1e3)
    cuts = [t0, marks["newton_in"], marks["newton_out"], marks["bwd_in"], marks["bwd_out"], t1]
    for part, a, b in zip(_PARTS, cuts, cuts[1:], strict=True):
        rows[part].append((b - a) * 1e3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--profile", action="store_true", help="also cProfile the first --steps")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("layer_host_split.py needs a CUDA GPU")
    dev = torch.device("cuda")
    marks: dict[str, float] = {}
    # The layer path calls the launchers through this module's names.
    fused_gru.newton = _marked(marks, "newton", fused_gru.newton)  # type: ignore[attr-defined]
    fused_gru.backward = _marked(marks, "bwd", fused_gru.backward)  # type: ignore[attr-defined]
    flush = l2_flush_buffer(dev)
    for tf32 in (False, True):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        for steps in args.steps:
            torch.manual_seed(0)
            _, forward_backward = gru_layer_calls(dev, Shape(8, steps, 256))
            rows: dict[str, list[float]] = {k: [] for k in ("gpu_ms", "host_ms", *_PARTS)}

            call = functools.partial(_split_call, forward_backward, marks, rows)
            for _ in range(5):
                forward_backward()
            torch.cuda.synchronize()
            for _ in range(30):
                rows["gpu_ms"].append(time_call_ms(call, dev, flush))
            split = ", ".join(f"{k} {statistics.median(v):.3f}" for k, v in rows.items())
            print(f"tf32={tf32} T={steps}: {split}", flush=True)
            if args.profile and steps == args.steps[0]:
                profiler = cProfile.Profile()
                for _ in range(50):
                    profiler.enable()
                    forward_backward()
                    torch.cuda.synchronize()
                    profiler.disable()
                pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
