"""The tf32x3 GEMM kernel's tiles, swept at a cell projection's two GEMMs.

On one CUDA GPU: the kernel of ``pararnn_kernels.linear`` launched with each tile shape
below at the forward ``[B·T, d] @ [d, 3d]`` and ``∂L/∂x = [B·T, 3d] @ [3d, d]`` (the weight
contiguous along the reduction, as the backward copies it) of a ParaGRU projection,
in ``"tf32x3"`` and, for reference, plain ``"tf32"`` products; PyTorch's float32 and TF32
GEMMs beside them; ``do_bench`` medians in µs and each result's largest error against a
float64 product relative to its largest element. Then the bias gradient's column sum two ways
(``sum(0)`` and a matrix-vector product with ones). ``plan_gemm`` was set from this table
(docs/benchmarks.md, 2026-12-07)::

    PYTHONPATH=$(ls -d packages/*/src | paste -sd:) python3 benchmarks/gemm_tiles.py --rows 32768
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
import triton.testing
from torch import Tensor

from pararnn_kernels.linear import ops

# (block_m, block_n, block_k, warps, stages)
TILES = [
    (128, 128, 32, 8, 3), (128, 128, 32, 4, 3), (128, 128, 32, 8, 4), (128, 128, 64, 8, 2),
    (128, 128, 64, 8, 3), (128, 128, 16, 8, 4), (128, 64, 32, 4, 4), (64, 128, 32, 4, 4),
    (128, 256, 32, 8, 3), (256, 128, 32, 8, 3), (64, 64, 32, 4, 4), (128, 64, 64, 4, 3),
    (64, 256, 32, 8, 3),
]  # fmt: skip


def matmul(a: Tensor, b: Tensor, precision: str, tile: tuple[int, int, int, int, int]) -> Tensor:
    block_m, block_n, block_k, warps, stages = tile
    plan = ops.GemmPlan(block_m, block_n, block_k, warps, stages, splits=1)
    return ops._matmul(a, b, plan=plan, precision=precision)


def median_us(fn: Callable[[], object]) -> float:
    return float(triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=8 * 4096, help="B·T")
    parser.add_argument("--width", type=int, default=256, help="d (the gates are 3d)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gemm_tiles.py needs a CUDA GPU")
    dev = torch.device("cuda")
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    rows, width = args.rows, args.width
    x = torch.randn(rows, width, device=dev)
    weight = torch.randn(3 * width, width, device=dev) / width**0.5
    grad_y = torch.randn(rows, 3 * width, device=dev)
    k_major = weight.t().contiguous().t()
    for name, a, b in (("forward", x, weight.t()), ("grad x", grad_y, k_major)):
        want = a.double() @ b.double()
        scale = float(want.abs().max())
        ieee = median_us(lambda a=a, b=b: a @ b)
        torch.backends.cuda.matmul.allow_tf32 = True
        tf32 = median_us(lambda a=a, b=b: a @ b)
        torch.backends.cuda.matmul.allow_tf32 = False
        print(f"{name} [{a.shape[0]}, {a.shape[1]}] @ [{b.shape[0]}, {b.shape[1]}]: "
              f"PyTorch float32 {ieee:.1f} us, TF32 {tf32:.1f} us", flush=True)  # fmt: skip
        results = []
        for tile in TILES:
            for precision in ("tf32x3", "tf32") if tile == TILES[0] else ("tf32x3",):
                try:
                    got = matmul(a, b, precision, tile)
                    us = median_us(lambda a=a, b=b, p=precision, t=tile: matmul(a, b, p, t))
                except Exception as err:  # a tile that does not compile or fit: say which
                    print(f"  {precision} {tile}: {type(err).__name__}", flush=True)
                    continue
                error = float((got.double() - want).abs().max()) / scale
                results.append((us, precision, tile, error))
        for us, precision, tile, error in sorted(results):
            print(f"  {precision} {tile}: {us:.1f} us, error {error:.1e}", flush=True)
    ones = torch.ones(rows, device=dev)
    print(
        f"bias gradient over [{rows}, {3 * width}]: sum(0) {median_us(lambda: grad_y.sum(0)):.1f}"
        f" us, GEMV with ones {median_us(lambda: grad_y.t().mv(ones)):.1f} us",
        flush=True,
    )


if __name__ == "__main__":
    main()
