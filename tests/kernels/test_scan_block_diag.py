"""scan_block_diag: k x k blocks per channel, every backend, both directions, forward and every
gradient against a float64 sequential loop (and autograd through it)."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from pararnn_kernels import scan_block_diag, sequential_scan_block_diag
from pararnn_kernels.scan.reference import reference_scan_block_diag
from pararnn_kernels.testing import assert_close

from .conftest import Case, check_against_sequential, needs_cuda
from .conftest import sequential_with_grads as oracle_with_grads

FORWARD_TOL = {
    torch.float64: 1e-12,
    torch.float32: 1e-5,
    torch.float16: 2e-3,
    torch.bfloat16: 1.6e-2,
}
GRAD_TOL = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def make_inputs(
    batch: int, steps: int, channels: int, k: int, *, dtype: torch.dtype, device: str, with_h0: bool
) -> tuple[Tensor, Tensor, Tensor | None]:
    # Blocks with spectral norm below 1 (entries of both signs): a contracting recurrence.
    raw = 2 * torch.rand(batch, steps, channels, k, k, dtype=torch.float64) - 1
    jac = 0.95 * raw / torch.linalg.matrix_norm(raw, ord=2).clamp_min(1.0)[..., None, None]
    rhs = torch.randn(batch, steps, channels, k, dtype=torch.float64)
    h0 = torch.randn(batch, channels, k, dtype=torch.float64) if with_h0 else None
    return (
        jac.to(dtype).to(device),
        rhs.to(dtype).to(device),
        h0.to(dtype).to(device) if h0 is not None else None,
    )


def sequential_with_grads(
    jac: Tensor, rhs: Tensor, h0: Tensor | None, grad_y: Tensor, reverse: bool
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    return oracle_with_grads(sequential_scan_block_diag, jac, rhs, h0, grad_y, reverse)


def steps_for(case: Case) -> list[int]:
    # The interpreter runs a custom-combine scan element by element: T = 1000 only compiled/eager.
    return [1, 2, 17, 63] if case.small else [1, 2, 17, 63, 1000]


@pytest.mark.parametrize("k", [2, 3, 4])
@pytest.mark.parametrize("with_h0", [False, True], ids=["zero-h0", "h0"])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_forward_and_gradients_match_sequential(
    case: Case, k: int, with_h0: bool, reverse: bool, poisoned: None
) -> None:
    batch, channels = (1, 3) if case.small else (2, 21)
    dtypes = [torch.float32] + ([torch.float64] if case.backend == "eager" else [])
    for steps in steps_for(case):
        for dtype in dtypes:
            jac, rhs, h0 = make_inputs(
                batch, steps, channels, k, dtype=dtype, device=case.device, with_h0=with_h0
            )
            check_against_sequential(
                scan_block_diag,
                sequential_scan_block_diag,
                jac,
                rhs,
                h0,
                torch.randn_like(rhs),
                reverse=reverse,
                backend=case.backend,
                forward_tol=FORWARD_TOL[dtype],
                grad_tol=GRAD_TOL[dtype],
                label=f"T={steps} {dtype}",
            )


def test_first_step_uses_h0(case: Case) -> None:
    jac = torch.tensor([[[[[1.0, 2.0], [0.0, -1.0]]]]], device=case.device)
    rhs = torch.tensor([[[[1.0, 1.0]]]], device=case.device)
    h0 = torch.tensor([[[3.0, 4.0]]], device=case.device)
    for reverse in (False, True):
        y = scan_block_diag(jac, rhs, h0, reverse=reverse, backend=case.backend)
        assert y.tolist() == [[[[12.0, -3.0]]]]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_low_precision_storage(case: Case, dtype: torch.dtype, poisoned: None) -> None:
    batch, channels, steps = (1, 3, 17) if case.small else (2, 21, 1000)
    for reverse in (False, True):
        jac, rhs, h0 = make_inputs(
            batch, steps, channels, 2, dtype=dtype, device=case.device, with_h0=True
        )
        grad_y = torch.randn(rhs.shape, device=case.device).to(dtype)
        ref_y, ref_gj, ref_gr, _ = sequential_with_grads(jac, rhs, h0, grad_y, reverse)
        leaves = [t.clone().requires_grad_() for t in (jac, rhs)]
        y = scan_block_diag(leaves[0], leaves[1], h0, reverse=reverse, backend=case.backend)
        assert_close(y, ref_y, tol=FORWARD_TOL[dtype], name="y")
        y.backward(grad_y)
        assert_close(leaves[0].grad, ref_gj, tol=GRAD_TOL[dtype], name="grad jac")
        assert_close(leaves[1].grad, ref_gr, tol=GRAD_TOL[dtype], name="grad rhs")


def test_noncontiguous_inputs_and_expanded_gradients(case: Case, poisoned: None) -> None:
    batch, channels, steps, k = (1, 3, 9, 2) if case.small else (2, 21, 100, 3)
    jac, rhs, h0 = make_inputs(
        batch, steps, channels, k, dtype=torch.float32, device="cpu", with_h0=True
    )
    assert h0 is not None
    # Transposed storage: the blocks are passed as strided views of their transposes.
    jac_view = jac.transpose(-1, -2).contiguous().to(case.device).transpose(-1, -2)
    rhs_view = rhs.transpose(1, 2).contiguous().to(case.device).transpose(1, 2)
    assert not jac_view.is_contiguous() and not rhs_view.is_contiguous()
    leaves = [t.detach().clone().requires_grad_() for t in (jac_view, rhs_view)]
    y = scan_block_diag(leaves[0], leaves[1], h0.to(case.device), backend=case.backend)
    y.sum().backward()  # an expanded (stride-0) upstream gradient
    ref_y, ref_gj, ref_gr, _ = sequential_with_grads(jac, rhs, h0, torch.ones_like(rhs), False)
    assert_close(y, ref_y, tol=1e-5, name="y")
    assert_close(leaves[0].grad, ref_gj, tol=1e-5, name="grad jac")
    assert_close(leaves[1].grad, ref_gr, tol=1e-5, name="grad rhs")


def test_large_blocks_run_eager_under_auto() -> None:
    jac, rhs, h0 = make_inputs(1, 17, 2, 5, dtype=torch.float64, device="cpu", with_h0=True)
    ref = sequential_scan_block_diag(jac, rhs, h0)
    assert_close(scan_block_diag(jac, rhs, h0, backend="auto"), ref, tol=1e-12, name="k=5")
    with pytest.raises(ValueError, match="k=4, got k=5"):
        scan_block_diag(jac.float(), rhs.float(), h0.float(), backend="triton")


def test_gradcheck_float64() -> None:
    jac, rhs, h0 = make_inputs(1, 7, 2, 3, dtype=torch.float64, device="cpu", with_h0=True)
    assert h0 is not None
    for reverse in (False, True):
        inputs = tuple(t.clone().requires_grad_() for t in (jac, rhs, h0))
        assert torch.autograd.gradcheck(
            lambda j, r, h, reverse=reverse: scan_block_diag(
                j, r, h, reverse=reverse, backend="eager"
            ),
            inputs,
        )


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("k", [2, 3, 4])
def test_long_sequences_on_gpu(k: int, poisoned: None) -> None:
    steps = 2**20 if k == 2 else 2**16
    jac, rhs, h0 = make_inputs(1, steps, 3, k, dtype=torch.float32, device="cuda", with_h0=True)
    for reverse in (False, True):
        ref = reference_scan_block_diag(
            jac.double(), rhs.double(), h0.double() if h0 is not None else None, reverse=reverse
        )
        y = scan_block_diag(jac, rhs, h0, reverse=reverse, backend="triton")
        assert_close(y, ref, tol=1e-5, name=f"y k={k} T={steps}")
