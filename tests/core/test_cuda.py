"""The core checks on a CUDA GPU with the Triton scans, at real sizes, in float32 and bfloat16.

References are the float64 sequential recurrence on the same device. bfloat16 tolerances are
stated per check: bf16 stores 8 mantissa bits (eps = 2^-7 ≈ 7.8e-3) and both the cell arithmetic
and the stored states round at that level every step. Measured on CPU (eager scans, B = 2,
d = 256, T = 4096): bf16 states differ from float64 by ≈ 1.2e-2 to 1.6e-2 -- exactly as much as
the bf16 *sequential* recurrence does -- and bf16 gradients by ≈ 1e-2 relative; the bounds below
leave about 3x of room, and bf16 Newton must also stay within 1.5x of bf16 sequential.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

import pararnn_core as pc

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

CELLS = [pc.ParaGRU, pc.ParaLSTM, pc.ParaSLSTM]
F64, F32, BF16 = torch.float64, torch.float32, torch.bfloat16
BATCH, WIDTH = 8, 256
#: (states abs tolerance, gradient tolerance relative to the gradient's max) per dtype.
TOLERANCE = {F32: (1e-5, 1e-5), BF16: (5e-2, 5e-2)}


def _case(cls, steps: int) -> tuple[pc.ParaCell, Tensor]:
    cell = cls(WIDTH, WIDTH, device="cuda", dtype=F64)
    x = torch.randn(BATCH, steps, WIDTH, device="cuda", dtype=F64)
    return cell, x


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("steps", [17, 256, 4096])
@pytest.mark.parametrize("cls", CELLS)
def test_newton_triton_equals_sequential(cls, steps, dtype, to_dtype, assert_close):
    cell, x = _case(cls, steps)
    low = to_dtype(cell, dtype, "cuda")
    with torch.no_grad():
        reference = pc.sequential_apply(cell, x)
        states, stats = pc.newton_apply(
            low, x.to(dtype), config=pc.NewtonConfig(scan_backend="triton")
        )
    error = (states.double() - reference).abs().max().item()
    print(f"{cls.__name__} T={steps} {dtype}: max error {error:.2e}, residuals {stats.residuals}")
    assert stats.backend == "triton" and stats.iters == 3
    atol, _ = TOLERANCE[dtype]
    assert_close(states, reference, atol=atol, what=f"{cls.__name__} T={steps} {dtype}")
    if dtype == BF16:
        with torch.no_grad():
            sequential_low = pc.sequential_apply(low, x.to(dtype))
        floor = (sequential_low.double() - reference).abs().max().item()
        assert error <= 1.5 * floor + 4e-3, (
            f"bf16 Newton {error:.3e} vs bf16 sequential {floor:.3e}"
        )


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("cls", CELLS)
def test_gradients_triton_equal_bptt(cls, dtype, to_dtype, assert_rel_close):
    steps = 1024
    cell, x = _case(cls, steps)
    weight = torch.randn(BATCH, steps, *cell.state_shape, device="cuda", dtype=F64)

    def grads(c: pc.ParaCell, xx: Tensor, solve) -> list[Tensor]:
        leaf = xx.clone().requires_grad_()
        states = solve(c, leaf)
        loss = (states * weight.to(states.dtype)).float().sum()
        return list(torch.autograd.grad(loss, [leaf, *c.parameters()]))

    reference = grads(cell, x, pc.sequential_apply)
    config = pc.NewtonConfig(scan_backend="triton")
    got = grads(
        to_dtype(cell, dtype, "cuda"),
        x.to(dtype),
        lambda c, a: pc.newton_apply(c, a, config=config)[0],
    )
    _, rel = TOLERANCE[dtype]
    names = ["x", *(n for n, _ in cell.named_parameters())]
    for name, g, r in zip(names, got, reference, strict=True):
        assert g.dtype == dtype
        assert_rel_close(g, r, rel=rel, what=f"{cls.__name__} {dtype} grad {name}")


def test_module_on_cuda_train_equals_eval(assert_close):
    model = pc.ParaRNN(
        [pc.ParaGRU(64, WIDTH, device="cuda"), pc.ParaLSTM(WIDTH, WIDTH, device="cuda")],
        pc.NewtonConfig(scan_backend="triton"),
    )
    x = torch.randn(BATCH, 2048, 64, device="cuda")
    with torch.no_grad():
        y_train = model.train()(x)
        y_eval = model.eval()(x)
    assert [s.backend for s in model.last_stats] == ["triton", "triton"]
    assert_close(y_train, y_eval, atol=1e-5, what="train vs eval on CUDA")
