"""The cells' input projection by ``linear_tf32x3`` against PyTorch's float32 GEMMs.

On one CUDA GPU, under PyTorch's default ``"highest"`` float32 matmul precision:

1. The three GEMMs of a projection ``[B·T, d] -> [B·T, 3d]`` as the kernel runs them: the
   forward and ∂L/∂x (the weight copied to be contiguous along the reduction) by tf32x3
   products, and the weight gradient on the stored layout by bf16x6 products: PyTorch in IEEE
   float32, PyTorch in TF32, and the kernel; ``do_bench`` medians in µs, each one's largest
   error against a float64 product relative to the product's largest element, and the
   kernel's plan.
2. A layer's forward+backward (``newton_apply`` with the fused kernels, ``cell.output``), each
   captured in a CUDA graph and replayed (``stats="device"``), with ``proj.backend = "eager"``
   (``F.linear``) and ``"auto"`` (the kernel), and cuDNN's ``nn.GRU``/``nn.LSTM`` of the same
   width under a graph too; ms and ratios.

    PYTHONPATH=$(ls -d packages/*/src | paste -sd:) python3 benchmarks/bench_projection.py
    ... --steps 4096 16384 --cells ParaGRU ParaLSTM --batch 8 --width 256
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import torch
import triton.testing
from host_calls import layer_calls  # the same layer calls, from this folder
from torch import Tensor, nn

import pararnn_core as pc
from pararnn_examples.bench.measure import cuda_graph_replay
from pararnn_kernels.linear import ops

CELLS = {"ParaGRU": (pc.ParaGRU, nn.GRU), "ParaLSTM": (pc.ParaLSTM, nn.LSTM)}


def median_us(fn: Callable[[], object]) -> float:
    return float(triton.testing.do_bench(fn, warmup=5, rep=40, return_mode="median")) * 1e3


def relative_error(got: Tensor, want: Tensor) -> float:
    return float((got.double() - want).abs().max()) / max(float(want.abs().max()), 1e-30)


def time_gemm(
    name: str, a: Tensor, b: Tensor, ours: Callable[[], Tensor], precision: str = "tf32x3"
) -> None:
    """``a @ b`` by PyTorch in float32 and in TF32, and ``ours()`` (the kernel's way of the same
    product, by ``precision``'s products); prints a line."""
    want = a.double() @ b.double()
    torch.backends.cuda.matmul.allow_tf32 = False
    ieee_us, ieee_err = median_us(lambda: a @ b), relative_error(a @ b, want)
    torch.backends.cuda.matmul.allow_tf32 = True
    tf32_us, tf32_err = median_us(lambda: a @ b), relative_error(a @ b, want)
    torch.backends.cuda.matmul.allow_tf32 = False
    ours_us, ours_err = median_us(ours), relative_error(ours(), want)
    plan = ops.plan_gemm(a.shape[0], b.shape[1], a.shape[1], a.device)
    print(
        f"GEMM [{a.shape[0]}, {a.shape[1]}] @ [{b.shape[0]}, {b.shape[1]}] {name}: "
        f"float32 {ieee_us:.1f} us (error {ieee_err:.1e}), TF32 {tf32_us:.1f} us "
        f"({tf32_err:.1e}), {precision} {ours_us:.1f} us ({ours_err:.1e}), "
        f"{ieee_us / ours_us:.2f}x; {plan}",
        flush=True,
    )


def gemms(rows: int, width: int, gates: int, dev: torch.device) -> None:
    """The three GEMMs of a projection as the kernel runs them: the forward, ∂L/∂x with the
    weight copied to be contiguous along the reduction (the copy timed with it), and the weight
    gradient on the operands as stored (bf16x6: the layout tf32x3 reads slowly)."""
    x = torch.randn(rows, width, device=dev)
    weight = torch.randn(gates * width, width, device=dev) / width**0.5
    grad_y = torch.randn(rows, gates * width, device=dev)
    time_gemm("forward x Wᵀ", x, weight.t(), lambda: ops._matmul(x, weight.t()))
    time_gemm(
        "∂L/∂x = g W", grad_y, weight, lambda: ops._matmul(grad_y, weight.t().contiguous().t())
    )
    time_gemm(
        "∂L/∂W = gᵀ x",
        grad_y.t(),
        x,
        lambda: ops._matmul(grad_y.t(), x, precision="bf16x6"),
        precision="bf16x6",
    )


def time_layer(name: str, x: Tensor, cotangent: Tensor) -> None:
    """A cell layer's forward+backward under CUDA graphs, both projections, and cuDNN's."""
    cls, cudnn_cls = CELLS[name]
    width = x.shape[-1]
    cell = cls(width, width).to(x.device)
    config = pc.NewtonConfig(scan_backend="fused", stats="device")
    _, ours = layer_calls(cell, x, cotangent, config)
    times = {}
    for backend in ("eager", "auto"):
        cell.proj.backend = backend
        times[backend] = median_us(cuda_graph_replay(ours, x.device)) / 1e3
    rnn = cudnn_cls(width, width, batch_first=True).to(x.device)
    rnn_params = list(rnn.parameters())

    def cudnn() -> None:
        for p in rnn_params:
            p.grad = None
        x.grad = None
        torch.autograd.backward(rnn(x)[0], cotangent)

    replay = cuda_graph_replay(cudnn, x.device)
    cudnn_ms = statistics.median(
        triton.testing.do_bench(replay, warmup=1, rep=200, return_mode="all")
    )
    eager, auto = times["eager"], times["auto"]
    print(
        f"{name} {tuple(x.shape)} forward+backward under graphs: F.linear {eager:.3f} ms, "
        f"tf32x3 {auto:.3f} ms ({eager / auto:.2f}x); cuDNN (TF32) {cudnn_ms:.2f} ms: "
        f"{cudnn_ms / eager:.1f}x / {cudnn_ms / auto:.1f}x",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--cells", nargs="+", choices=sorted(CELLS), default=sorted(CELLS))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--width", type=int, default=256)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_projection.py needs a CUDA GPU")
    dev = torch.device("cuda")
    torch.manual_seed(0)
    torch.set_float32_matmul_precision("highest")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    gemms(args.batch * args.steps[0], args.width, 3, dev)
    for steps in args.steps:
        x = torch.randn(args.batch, steps, args.width, device=dev, requires_grad=True)
        cotangent = torch.randn_like(x)
        for name in args.cells:
            time_layer(name, x, cotangent)


if __name__ == "__main__":
    main()
