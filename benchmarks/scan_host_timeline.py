"""Where the host time of one ``scan_diag`` forward+backward goes, step by step.

On one CUDA GPU: for each storage dtype at one shape (``--shape``, default 8x4096x1536), 50
forward+backward calls of the public ``scan_diag`` (Triton, fixed cotangent), each started on an
idle GPU, with ``perf_counter`` stamps inside the launch path: the autograd function's forward
and backward (``FN<``/``FN>``), the plan lookup, every ``torch.empty``/``torch.zeros``/
``torch.empty_like``, every relaunch of a compiled kernel (``launch<``/``launch>``),
``scan_diag``'s return (``m:ret``) and ``torch.autograd.backward``'s (``e:ret``), as medians in
µs from the call's start (``f:``/``b:`` = forward/backward; ``N`` counts repeats). Beside it the
floor of any autograd function on that host (one ``empty_like`` forward, two backward) and,
when it imports, accelerated-scan's forward and backward host time at the same shape. The
wrappers add their own small cost; compare steps, not totals, with ``host_calls.py``::

    python3 benchmarks/scan_host_timeline.py --shape 8x4096x1536
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from pararnn_examples.bench import Shape, parse_shape
from pararnn_kernels import _launch, scan_diag
from pararnn_kernels.scan import launch, ops

_STAMPS: dict[str, float] = {}
_COUNTS: collections.Counter[str] = collections.Counter()
_PHASE = ["f"]


def _stamp(name: str) -> None:
    label = f"{_PHASE[0]}:{name}"
    _COUNTS[label] += 1
    _STAMPS[f"{label}{_COUNTS[label]}"] = time.perf_counter()


def _stamped(fn: Callable[..., Any], name: str, phase: str | None = None) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if phase is not None:
            _PHASE[0] = phase
        _stamp(f"{name}<")
        result = fn(*args, **kwargs)
        _stamp(f"{name}>")
        return result

    return wrapper


def instrument() -> None:
    """Wrap the launch path's steps with stamps (for this process only)."""
    scan_fn = ops._EagerTritonScan
    scan_fn.forward = staticmethod(_stamped(scan_fn.forward, "FN"))  # type: ignore[method-assign]
    scan_fn.backward = staticmethod(_stamped(scan_fn.backward, "FN", "b"))  # type: ignore[method-assign]
    launch.plan_scan_diag = _stamped(launch.plan_scan_diag, "plan")  # type: ignore[assignment]
    for name in ("empty", "zeros", "empty_like"):
        setattr(torch, name, _stamped(getattr(torch, name), name))
    _launch._Relauncher.launch = _stamped(_launch._Relauncher.launch, "launch")  # type: ignore[method-assign]


def ours(shape: Shape, dtype: torch.dtype, calls: int = 50) -> str:
    dev = torch.device("cuda")
    jac = (torch.rand(*shape, device=dev) * 1.8 - 0.9).to(dtype).requires_grad_()
    rhs = torch.randn(*shape, device=dev).to(dtype).requires_grad_()
    cotangent = torch.randn(*shape, device=dev).to(dtype)
    rows: list[dict[str, float]] = []
    for _ in range(calls):
        jac.grad = None
        rhs.grad = None
        torch.cuda.synchronize()
        time.sleep(0.002)
        _STAMPS.clear()
        _COUNTS.clear()
        _PHASE[0] = "f"
        start = time.perf_counter()
        y = scan_diag(jac, rhs, backend="triton")
        _PHASE[0] = "m"
        _stamp("ret")
        torch.autograd.backward(y, cotangent)
        _PHASE[0] = "e"
        _stamp("ret")
        rows.append({k: (v - start) * 1e6 for k, v in _STAMPS.items()})
    rows = rows[10:]
    medians = {k: statistics.median(row[k] for row in rows) for k in rows[0]}
    steps = "  ".join(f"{k}={v:.0f}" for k, v in sorted(medians.items(), key=lambda kv: kv[1]))
    return f"ours {tuple(shape)} {dtype}, µs: {steps}"


class _Empty(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(a, b)
        return torch.empty_like(a)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = ctx.saved_tensors
        return torch.empty_like(a), torch.empty_like(b)


def host_split(
    name: str, fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], shape: Shape,
    dtype: torch.dtype, calls: int = 50,
) -> str:  # fmt: skip
    """Median host µs of ``fn(a, b)`` and of its backward, each started on an idle GPU."""
    dev = torch.device("cuda")
    a = torch.rand(*shape, device=dev).to(dtype).requires_grad_()
    b = torch.rand(*shape, device=dev).to(dtype).requires_grad_()
    cotangent = torch.randn(*shape, device=dev).to(dtype)
    forward: list[float] = []
    backward: list[float] = []
    for _ in range(calls):
        a.grad = None
        b.grad = None
        torch.cuda.synchronize()
        time.sleep(0.002)
        t0 = time.perf_counter()
        y = fn(a, b)
        t1 = time.perf_counter()
        torch.autograd.backward(y, cotangent)
        t2 = time.perf_counter()
        forward.append((t1 - t0) * 1e6)
        backward.append((t2 - t1) * 1e6)
    fwd, bwd = statistics.median(forward[10:]), statistics.median(backward[10:])
    return f"{name} {tuple(shape)} {dtype}: forward {fwd:.0f} µs, backward {bwd:.0f} µs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", type=parse_shape, default=Shape(8, 4096, 1536), help="BxTxD")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("scan_host_timeline.py needs a CUDA GPU")
    try:
        from accelerated_scan.scalar import scan as accelerated_scan
    except ImportError as err:
        accelerated_scan = None
        print(f"accelerated-scan skipped: {err}")
    instrument()
    batch, steps, width = args.shape
    for dtype in (torch.float32, torch.bfloat16):
        print(ours(args.shape, dtype), flush=True)
        print(host_split("empty autograd function", _Empty.apply, args.shape, dtype), flush=True)
        if accelerated_scan is not None:
            # Its layout is [B, D, T]; the layout does not change the host time.
            peer_shape = Shape(batch, width, steps)
            print(host_split("accelerated-scan", accelerated_scan, peer_shape, dtype), flush=True)


if __name__ == "__main__":
    main()
