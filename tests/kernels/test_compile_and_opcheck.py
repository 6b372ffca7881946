"""torch.library integration: torch.compile(fullgraph=True) traces the ops and opcheck passes."""

from __future__ import annotations

import pytest
import torch

from pararnn_kernels import scan_block_diag, scan_diag
from pararnn_kernels.scan import ops
from pararnn_kernels.testing import assert_close

from .conftest import needs_cuda


def diag_inputs(device: str, steps: int = 33) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (
        0.9 * torch.rand(2, steps, 5, device=device),
        torch.randn(2, steps, 5, device=device),
        torch.randn(2, 5, device=device),
    )


def block_inputs(device: str, steps: int = 9) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (
        0.4 * torch.rand(2, steps, 3, 2, 2, device=device),
        torch.randn(2, steps, 3, 2, device=device),
        torch.randn(2, 3, 2, device=device),
    )


def check_compiled(fn: object, args: tuple[torch.Tensor, ...], compile_backend: str) -> None:
    compiled = torch.compile(fn, fullgraph=True, backend=compile_backend)  # type: ignore[call-overload]
    leaves = [a.clone().requires_grad_() for a in args]
    expected_leaves = [a.clone().requires_grad_() for a in args]
    out = compiled(*leaves)
    expected = fn(*expected_leaves)  # type: ignore[operator]
    assert_close(out, expected, tol=1e-6, name="compiled forward")
    out.square().sum().backward()
    expected.square().sum().backward()
    for got, want in zip(leaves, expected_leaves, strict=True):
        assert got.grad is not None and want.grad is not None
        assert_close(got.grad, want.grad, tol=1e-6, name="compiled gradient")


def test_compile_fullgraph_eager_backend_cpu() -> None:
    torch._dynamo.reset()
    check_compiled(
        lambda j, r, h: scan_diag(j, r, h, backend="eager") * 2, diag_inputs("cpu"), "aot_eager"
    )
    check_compiled(
        lambda j, r, h: scan_block_diag(j, r, h, reverse=True, backend="eager"),
        block_inputs("cpu"),
        "aot_eager",
    )


def test_opcheck_eager_ops_cpu() -> None:
    jac, rhs, h0 = diag_inputs("cpu", 9)
    for reverse in (False, True):
        torch.library.opcheck(ops._scan_diag_eager, (jac, rhs, h0, reverse))
        torch.library.opcheck(ops._scan_diag_eager, (jac, rhs, None, reverse))
        bj, br, bh = block_inputs("cpu")
        torch.library.opcheck(ops._scan_block_diag_eager, (bj, br, bh, reverse))


@pytest.mark.cuda
@needs_cuda
def test_compile_fullgraph_triton_cuda() -> None:
    torch._dynamo.reset()
    check_compiled(lambda j, r, h: scan_diag(j, r, h) * 2, diag_inputs("cuda", 300), "inductor")
    check_compiled(
        lambda j, r, h: scan_block_diag(j, r, h, reverse=True), block_inputs("cuda", 70), "inductor"
    )


@pytest.mark.cuda
@needs_cuda
def test_opcheck_triton_ops_cuda() -> None:
    jac, rhs, h0 = diag_inputs("cuda", 300)
    bj, br, bh = block_inputs("cuda", 70)
    for reverse in (False, True):
        torch.library.opcheck(ops._scan_diag_triton, (jac, rhs, h0, reverse))
        torch.library.opcheck(ops._scan_diag_triton, (jac, rhs, None, reverse))
        torch.library.opcheck(ops._scan_block_diag_triton, (bj, br, bh, reverse))
        torch.library.opcheck(ops._scan_block_diag_triton, (bj, br, None, reverse))
