"""The fused kernels' σ, tanh, exp and log against float64, special values included.

Compiled (``cuda`` cases), these are the GPU's approximate instructions with denormals flushed
(``pararnn_kernels.fused._kernels``: ``_sigmoid``, ``_tanh``, ``_exp``, ``_log``); in the
interpreter (CPU cases) Triton's own functions. Tolerance, for a finite float64 reference ``r``
of the float32 input ``x``: ``|y - r| <= (6e-7 + 1.2e-7 |x|) |r| + 1e-37`` for σ and exp: exp of
``x`` goes through ``2^(x log2 e)``, whose float32 exponent is rounded (up to ``|x| · 2^-24``
relative in the result, and half that again from ``log2 e``'s own rounding: 9e-8 ``|x|``), then
``ex2.approx`` (2 ulp) and for σ ``rcp.approx`` (1 ulp); measured on an H200: σ(-25.4) off by
1.7e-6 relative. Results below the smallest normal float32 may flush to zero. ``5e-7`` absolute
for tanh; ``5e-7 + 2.5e-7 r`` for ``log(1 + |x|)`` (``lg2.approx`` then a float32 product: near
``r = 69`` one float32 ulp is 7.6e-6, measured on an H100). An infinite reference must be met
exactly, a NaN input must give NaN (the Newton kernels' divergence check depends on NaN
propagating).
"""

from __future__ import annotations

import math

import pytest
import torch
import triton
import triton.language as tl
from torch import Tensor

from pararnn_kernels.fused._kernels import _exp, _log, _sigmoid, _tanh

from .conftest import needs_cuda, needs_interpreter


@triton.jit
def _math_kernel(x_ptr, out_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, _sigmoid(x), mask=mask)
    tl.store(out_ptr + N + offs, _tanh(x), mask=mask)
    tl.store(out_ptr + 2 * N + offs, _exp(x), mask=mask)
    tl.store(out_ptr + 3 * N + offs, _log(1.0 + tl.abs(x)), mask=mask)


def _inputs(device: str) -> Tensor:
    special = [0.0, -0.0, 1e-30, -1e-30, 1e-7, -1e-7, 0.5, -0.5, 88.0, -88.0, 89.0, -89.0,
               100.0, -100.0, 1e30, -1e30, math.inf, -math.inf, math.nan]  # fmt: skip
    sweep = torch.linspace(-30.0, 30.0, 301).tolist()
    return torch.tensor(special + sweep, dtype=torch.float32, device=device)


def _check(name: str, got: Tensor, want: Tensor, x: Tensor, bound: Tensor) -> None:
    nan = torch.isnan(x)
    assert torch.isnan(got[nan]).all(), f"{name}: NaN in, not NaN out"
    want32 = want.float()  # what float32 can hold of the exact value (inf past its range)
    exact = torch.isinf(want32) & ~nan
    assert torch.equal(got[exact], want32[exact]), f"{name}: {got[exact]} for {want32[exact]}"
    finite = ~nan & ~exact
    err = (got[finite].double() - want[finite]).abs()
    over = err > bound[finite]
    if over.any():
        i = int(over.nonzero()[0])
        raise AssertionError(
            f"{name}({x[finite][i].item()!r}) = {got[finite][i].item()!r}, float64 "
            f"{want[finite][i].item()!r}: error {err[i].item():.3e} > {bound[finite][i].item():.3e}"
        )


def _run(device: str) -> None:
    x = _inputs(device)
    n = x.numel()
    out = torch.full((4 * n,), 12345.0, device=device)
    _math_kernel[(triton.cdiv(n, 128),)](x, out, n, BLOCK=128)
    sigmoid, tanh, exp, log = out.reshape(4, n)
    x64 = x.double()
    relative = (6e-7 + 1.2e-7 * x64.abs().nan_to_num(posinf=0.0)).clamp(max=1.0)
    _check("sigmoid", sigmoid, torch.sigmoid(x64), x, relative * torch.sigmoid(x64) + 1e-37)
    _check("tanh", tanh, torch.tanh(x64), x, torch.full_like(x64, 5e-7))
    with torch.no_grad():
        ref_exp = torch.exp(x64)
    _check("exp", exp, ref_exp, x, relative * ref_exp.nan_to_num(posinf=0.0) + 1e-37)
    ref_log = torch.log1p(x64.abs())
    _check("log(1+|x|)", log, ref_log, x, 5e-7 + 2.5e-7 * ref_log.nan_to_num(posinf=0.0))


@needs_interpreter
def test_fused_math_in_the_interpreter() -> None:
    _run("cpu")


@pytest.mark.cuda
@needs_cuda
def test_fused_math_compiled() -> None:
    _run("cuda")
