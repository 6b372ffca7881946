"""``linear_tf32x3``: a float32 linear layer's GEMMs on tensor cores, to float32 accuracy.

PyTorch runs a float32 ``F.linear`` on the CUDA cores unless TF32 is allowed
(``torch.set_float32_matmul_precision("high")``), and TF32 keeps 10 of float32's 23 mantissa
bits. Here every float32 operand is split into a TF32 head and a TF32 tail (``x = x_hi + x_lo``)
and each product is taken as ``x_hi y_hi + x_hi y_lo + x_lo y_hi`` on the tensor cores
(``tl.dot(..., input_precision="tf32x3")``), accumulated in float32: about 22 of float32's 24
significant bits per product instead of TF32's 11, at the tensor cores' throughput.

The tensor cores' float32 products read tiles that are contiguous along the reduction: the
forward ``x Wᵀ`` has both operands so, and ``∂L/∂x = ∂L/∂y W`` does once the (small) weight is
copied to that layout. The weight gradient ``(∂L/∂y)ᵀ x`` reduces over the rows of both, which
neither is contiguous along (tf32x3 ran it at 0.61-0.73x PyTorch's float32 GEMM on an H100), so
it takes ``"bf16x6"`` products instead: each float32 tile split into three bfloat16 parts in the
kernel and six products of them on the bfloat16 tensor cores, which read either orientation
(on an H100 1.30-1.36x PyTorch's float32 GEMM, with a quarter of its error; docs/benchmarks.md).
The bias gradient stays PyTorch's (a matrix-vector product). A reduction that fills too few
output tiles is split along its length into slices summed afterwards in a fixed order (no
atomics: repeatable to the bit).

Traced calls (``torch.compile``, fake tensors) run ``F.linear``: the compiler picks its own GEMMs.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from .._launch import launchable, plain_eager
from ..dispatch import (
    KNOWN_BACKENDS,
    ResolvedBackend,
    device_capability,
    multiprocessor_count,
    triton_installed,
    triton_interpret_mode,
)

__all__ = [
    "AUTO_MIN_ROWS",
    "GemmPlan",
    "linear_tf32x3",
    "plan_gemm",
    "resolve_linear_backend",
]

#: Tensor cores with TF32 products: compute capability 8.0 (Ampere) on.
_TF32_CAPABILITY = (8, 0)
#: What the kernel reads by pointer: a tensor subclass (a DTensor, say) goes to F.linear.
_PLAIN = (Tensor, nn.Parameter)
#: ``"auto"`` leaves products of fewer rows to ``F.linear``: a one-step projection while
#: decoding is a few rows, where a 128-row tile would compute mostly padding.
AUTO_MIN_ROWS = 1024
#: A reduction is split only while each slice keeps at least this many steps of it.
_MIN_SLICE = 512
#: Compute capability majors whose shared memory holds :func:`plan_gemm`'s 64-step stages.
_WIDE_K_MAJORS = (9, 10)


@dataclass(frozen=True)
class GemmPlan:
    """Launch shape of one GEMM: output tiles of ``block_m x block_n``, ``block_k`` of the
    reduction per step, ``stages`` steps in flight, ``splits`` slices of the reduction."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    stages: int
    splits: int


def plan_gemm(m: int, n: int, k: int, device: torch.device) -> GemmPlan:
    """The launch plan of ``[m, k] @ [k, n]``: 128 x 128 tiles, eight warps, three stages, 64
    steps of the reduction at a time on compute capability 9.x and 10.x (32 elsewhere); the
    reduction split into slices (of at least :data:`_MIN_SLICE` steps) while the tiles fill
    fewer than two waves of the device's multiprocessors (few rows and columns over a long
    reduction).

    Three stages of 128 x 64 float32 tiles of both operands take 192 KiB of shared memory,
    which the H100/H200 and B200 have (227 KiB per block) and Ampere (163 KiB) and the
    consumer cards (99 KiB) do not; on an H100 they took the projection's forward and ``∂L/∂x``
    GEMMs from 204 / 187 µs with 32 steps to 195 / 172 µs (docs/benchmarks.md)."""
    block_m = block_n = 128
    tiles = math.ceil(m / block_m) * math.ceil(n / block_n)
    waves = 2 * multiprocessor_count(device)
    splits = max(1, min(math.ceil(waves / tiles), k // _MIN_SLICE)) if tiles < waves else 1
    capability = device_capability(device)
    block_k = 64 if capability is not None and capability[0] in _WIDE_K_MAJORS else 32
    return GemmPlan(block_m, block_n, block_k, 8, 3, splits)


@functools.cache
def _kernel() -> Any:
    # Imported on first use: importing this module compiles nothing and needs no Triton.
    from ._kernels import matmul_kernel

    return matmul_kernel


def _matmul(
    a: Tensor,
    b: Tensor,
    bias: Tensor | None = None,
    *,
    plan: GemmPlan | None = None,
    precision: str = "tf32x3",
) -> Tensor:
    """``a [M, K] @ b [K, N] (+ bias [N])`` in float32 by the kernel; operands of any strides.
    ``precision``: ``"tf32x3"`` (fast when both operands are contiguous along K:
    ``a.stride(1) == b.stride(0) == 1``), ``"bf16x6"`` (either orientation: the weight
    gradient), or for benchmarks ``tl.dot``'s own (``"tf32"``, ``"ieee"``). ``plan`` (default
    :func:`plan_gemm`'s) is for benchmarks."""
    m, k = a.shape
    n = b.shape[1]
    plan = plan or plan_gemm(m, n, k, a.device)
    per_slice = math.ceil(math.ceil(k / plan.splits) / plan.block_k) * plan.block_k
    splits = math.ceil(k / per_slice)
    out = torch.empty((splits, m, n), device=a.device, dtype=torch.float32)
    grid = (math.ceil(m / plan.block_m) * math.ceil(n / plan.block_n), splits)
    launchable(_kernel())[grid](
        a, b, out, bias if bias is not None else out,
        m, n, k, per_slice,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1),
        out.stride(0), out.stride(1), out.stride(2),
        HAS_BIAS=bias is not None, BLOCK_M=plan.block_m, BLOCK_N=plan.block_n,
        BLOCK_K=plan.block_k, GROUP_M=8, PRECISION=precision, STAGES=plan.stages,
        num_warps=plan.num_warps,
    )  # fmt: skip
    return out[0] if splits == 1 else out.sum(0)


class _LinearTF32x3(torch.autograd.Function):
    """``y = x Wᵀ + b`` on ``x [M, K]`` by the kernel; backward ``∂L/∂x = ∂L/∂y W`` by the
    kernel (on a copy of W contiguous along its rows' reduction), ``∂L/∂W = (∂L/∂y)ᵀ x`` by the
    kernel's bf16x6 products on the operands as stored, ``∂L/∂b = Σ_rows ∂L/∂y`` by PyTorch
    (module docstring)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _matmul(x, weight.t(), bias)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_y: Tensor) -> tuple[Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        grad_y = grad_y.contiguous()
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = _matmul(grad_y, weight.t().contiguous().t())
        if ctx.needs_input_grad[1]:
            grad_w = _matmul(grad_y.t(), x, precision="bf16x6")
        if ctx.has_bias and ctx.needs_input_grad[2]:
            # Σ_rows as a matrix-vector product: cuBLAS's GEMV read [32768, 768] in 48 µs on
            # an H100 where the column reduction of ``grad_y.sum(0)`` took 77 µs.
            grad_b = grad_y.t().mv(grad_y.new_ones(grad_y.shape[0]))
        return grad_x, grad_w, grad_b


def resolve_linear_backend(
    backend: str, x: Tensor, weight: Tensor, bias: Tensor | None
) -> ResolvedBackend:
    """``"triton"`` (the tf32x3 kernel) or ``"eager"`` (``F.linear``) for these operands.

    ``"auto"`` takes the kernel for float32 CUDA operands on compute capability >= 8.0 while
    PyTorch's float32 matmul precision is ``"highest"`` (under ``"high"`` or ``"medium"`` the
    caller has asked for TF32 or bfloat16 products, which ``F.linear`` then gives, faster), in
    plain eager mode, with no empty dimension, on plain tensors or parameters (a tensor
    subclass such as a ``DTensor`` has no single storage to read), for at least
    :data:`AUTO_MIN_ROWS` rows of ``x`` (``x.numel() / d_in``); ``"eager"`` otherwise.

    Raises:
        ValueError: an unknown backend name, or ``"triton"`` for operands it cannot serve
            (naming what is missing).
    """
    if backend not in KNOWN_BACKENDS:
        known = ", ".join(repr(name) for name in KNOWN_BACKENDS)
        raise ValueError(f"backend must be one of {known}; got {backend!r}")
    if backend == "eager" or (backend == "auto" and not plain_eager()):
        # A traced call looks at nothing else (torch.compile folds this test away).
        return "eager"
    operands = (x, weight) if bias is None else (x, weight, bias)
    problem = None
    if not triton_installed():
        problem = "the 'triton' package, which is not installed"
    elif x.device.type != "cuda" and not triton_interpret_mode():
        problem = f"CUDA tensors (or TRITON_INTERPRET=1), got device {x.device}"
    elif any(t.dtype != torch.float32 for t in operands):
        dtypes = ", ".join(str(t.dtype) for t in operands)
        problem = f"float32 operands, got {dtypes}"
    elif (device_capability(x.device) or _TF32_CAPABILITY) < _TF32_CAPABILITY:
        major, minor = device_capability(x.device) or (0, 0)
        problem = f"compute capability >= 8.0 (TF32 tensor cores), {x.device} has {major}.{minor}"
    elif x.numel() == 0 or weight.numel() == 0:
        problem = f"non-empty operands, got x {tuple(x.shape)}, weight {tuple(weight.shape)}"
    elif any(type(t) not in _PLAIN for t in operands):
        kinds = ", ".join(type(t).__name__ for t in operands)
        problem = f"plain tensors or parameters (not tensor subclasses), got {kinds}"
    if backend == "triton":
        if problem is not None:
            raise ValueError(f"backend='triton' needs {problem}; use backend='eager' or 'auto'")
        return "triton"
    if problem is not None or x.device.type != "cuda":
        return "eager"
    if x.numel() < AUTO_MIN_ROWS * x.shape[-1]:
        return "eager"
    return "triton" if torch.get_float32_matmul_precision() == "highest" else "eager"


def _check_linear_inputs(x: object, weight: object, bias: object) -> tuple[Tensor, Tensor]:
    for name, value in (("x", x), ("weight", weight), ("bias", bias)):
        if not isinstance(value, Tensor) and (name != "bias" or value is not None):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if not isinstance(x, Tensor) or not isinstance(weight, Tensor):  # for the type checker
        raise TypeError("x and weight must be tensors")
    if weight.dim() != 2:
        raise ValueError(
            f"weight must have 2 dimensions [d_out, d_in], got shape {tuple(weight.shape)}"
        )
    if x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"x must have shape [..., d_in] with d_in = weight.shape[1] = {weight.shape[1]}, "
            f"got {tuple(x.shape)}"
        )
    if isinstance(bias, Tensor) and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(
            f"bias must have shape [d_out] = ({weight.shape[0]},), got {tuple(bias.shape)}"
        )
    for name, value in (("weight", weight), ("bias", bias)):
        if isinstance(value, Tensor) and value.device != x.device:
            raise ValueError(f"{name} must be on x's device {x.device}, got {value.device}")
    return x, weight


def linear_tf32x3(
    x: Tensor, weight: Tensor, bias: Tensor | None = None, *, backend: str = "auto"
) -> Tensor:
    """``x @ weight.T + bias`` for float32 operands, its products taken on the tensor cores as
    three TF32 products each (module docstring), accumulated in float32; differentiable in all
    three (``∂L/∂x`` the same way, ``∂L/∂W`` by bf16x6 products, ``∂L/∂b`` by PyTorch), once:
    on the kernel's path the backward is not itself differentiable (``create_graph=True``
    through it raises), as for the library's scans and Newton solves.

    Args:
        x: ``[..., d_in]``.
        weight: ``[d_out, d_in]``.
        bias: ``[d_out]`` or None.
        backend: ``"auto"`` (the kernel where :func:`resolve_linear_backend` allows it,
            ``F.linear`` elsewhere), ``"triton"`` (the kernel, or ``ValueError``) or ``"eager"``
            (``F.linear``).

    Returns:
        ``[..., d_out]`` in float32 (``F.linear``'s dtype on the eager path). The GPU tests
        bound its error against a float64 product by four times that of PyTorch's IEEE float32
        GEMM on the same operands (``docs/kernels.md``).

    Example:
        >>> import torch
        >>> from pararnn_kernels import linear_tf32x3
        >>> linear_tf32x3(torch.ones(2, 3), torch.ones(4, 3), torch.zeros(4)).shape
        torch.Size([2, 4])
    """
    x, weight = _check_linear_inputs(x, weight, bias)
    if resolve_linear_backend(backend, x, weight, bias) == "eager":
        return F.linear(x, weight, bias)
    rows = x.reshape(-1, x.shape[-1])
    needs_grad = torch.is_grad_enabled() and (
        x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    )
    if needs_grad:
        y: Tensor = _LinearTF32x3.apply(rows, weight, bias)
    else:
        y = _matmul(rows, weight.t(), bias)
    return y.reshape(*x.shape[:-1], weight.shape[0])
