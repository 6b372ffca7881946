"""Host-bound calls, timed as pararnn-bench times one call: for comparing two trees in one run.

On one CUDA GPU: ``scan_diag`` forward (under ``no_grad``) and forward+backward at
(8, 4096, 1536) (``--scan-shape``, repeatable) in fp32 and bf16, and a ParaGRU layer
(``scan_backend="fused"``) forward and forward+backward at (8, 4096, 256) in fp32. Each call is
timed with a 256 MiB L2 flush before it and CUDA events around it, synchronized after it; its
host time by ``perf_counter``. Medians of 30 calls after 5 warm-up calls. For the scans'
forward+backward also the host time of the forward (with grad) and of the backward alone (each
started on an idle GPU) and the time per call back to back (``do_bench``: the kernels' time
where the host keeps ahead). Which tree runs is ``PYTHONPATH``'s choice, so two trees compare
by alternating runs in one session::

    git archive <rev> packages | tar -x -C /tmp/old
    for tree in /tmp/old $PWD /tmp/old $PWD; do
        PYTHONPATH=$(ls -d $tree/packages/*/src | paste -sd:) python3 benchmarks/host_calls.py
    done
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import triton.testing

import pararnn_core as pc
import pararnn_kernels
from pararnn_examples.bench import Shape
from pararnn_examples.bench.cases import parse_shape
from pararnn_examples.bench.measure import l2_flush_buffer, measure
from pararnn_kernels import scan_diag

LAYER_SHAPE = Shape(8, 4096, 256)


def scan_calls(
    dtype: torch.dtype, dev: torch.device, shape: Shape
) -> tuple[list[tuple[str, Callable[[], None]]], Callable[[], str]]:
    """The scan's timed calls (forward under ``no_grad``, forward+backward) and its host split."""
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

    def host_split() -> str:
        """Host ms of the forward with grad and of its backward, each on an idle GPU."""
        forward_ms: list[float] = []
        backward_ms: list[float] = []
        for _ in range(30):
            jac.grad = None
            rhs.grad = None
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            y = scan_diag(jac, rhs, backend="triton")
            forward_ms.append((time.perf_counter() - t0) * 1e3)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            torch.autograd.backward(y, cotangent)
            backward_ms.append((time.perf_counter() - t0) * 1e3)
        back_to_back = triton.testing.do_bench(forward_backward, return_mode="median")
        return (
            f"host of the forward {statistics.median(forward_ms):.3f} ms, of the backward "
            f"{statistics.median(backward_ms):.3f} ms; back to back {back_to_back:.3f} ms"
        )

    name = f"scan_diag {dtype} {tuple(shape)}"
    return [(f"{name} fwd, no_grad", forward), (f"{name} fwd+bwd", forward_backward)], host_split


def layer_calls(
    cell: pc.ParaCell, x: torch.Tensor, cotangent: torch.Tensor, config: pc.NewtonConfig
) -> tuple[Callable[[], None], Callable[[], None]]:
    """A cell layer's forward under ``no_grad`` and its forward+backward (``newton_apply`` with
    ``config``, then ``cell.output``), the gradients cleared before each call."""
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

    return forward, forward_backward


def gru_layer_calls(
    dev: torch.device, shape: Shape = LAYER_SHAPE
) -> tuple[Callable[[], None], Callable[[], None]]:
    """A fp32 ParaGRU layer (``scan_backend="fused"``) on ``[B, T, d]`` inputs: its forward under
    ``no_grad`` and its forward+backward (``profile_layer.py`` profiles the latter)."""
    batch, steps, width = shape
    cell = pc.ParaGRU(width, width).to(dev)
    x = torch.randn(batch, steps, width, device=dev, requires_grad=True)
    cotangent = torch.randn(batch, steps, width, device=dev)
    return layer_calls(cell, x, cotangent, pc.NewtonConfig(scan_backend="fused"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scan-shape", type=parse_shape, action="append", help="BxTxD")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("host_calls.py needs a CUDA GPU")
    dev = torch.device("cuda")
    torch.manual_seed(0)
    print(f"pararnn_kernels from {pararnn_kernels.__file__}", flush=True)
    flush = l2_flush_buffer(dev)
    scans: list[tuple[str, Callable[[], None]]] = []
    splits: list[tuple[str, Callable[[], str]]] = []
    for shape in args.scan_shape or [Shape(8, 4096, 1536)]:
        for dtype in (torch.float32, torch.bfloat16):
            calls, split = scan_calls(dtype, dev, shape)
            scans += calls
            splits.append((calls[-1][0], split))
    layer_forward, layer_forward_backward = gru_layer_calls(dev)
    layer = f"ParaGRU layer fp32 {tuple(LAYER_SHAPE)}"
    calls = [
        *scans,
        (f"{layer} fwd, no_grad", layer_forward),
        (f"{layer} fwd+bwd", layer_forward_backward),
    ]
    for name, fn in calls:
        timing = measure(fn, dev, warmup=5, repeats=30, slow_ms=float("inf"), flush=flush)
        ms, host_ms = timing.median_ms, timing.median_host_ms
        print(f"{name}: {ms:.3f} ms per synced call, host {host_ms:.3f} ms", flush=True)
    for name, split in splits:
        print(f"{name}: {split()}", flush=True)


if __name__ == "__main__":
    main()
