"""Fixtures for the pararnn-kernels tests: (device, backend) cases and NaN-poisoned allocations."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
import torch
from torch import Tensor

from pararnn_kernels.dispatch import triton_interpret_mode
from pararnn_kernels.testing import assert_close, nan_poisoned_allocations

HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
needs_interpreter = pytest.mark.skipif(
    not triton_interpret_mode(), reason="Triton on CPU tensors needs TRITON_INTERPRET=1"
)


@dataclass(frozen=True)
class Case:
    """Where a scan runs. ``small`` cases run in the Triton interpreter: keep B·T·D tiny there."""

    device: str
    backend: str

    @property
    def small(self) -> bool:
        return self.device == "cpu" and self.backend == "triton"


CASES = [
    pytest.param(Case("cpu", "eager"), id="cpu-eager"),
    pytest.param(Case("cpu", "triton"), id="cpu-triton", marks=needs_interpreter),
    pytest.param(Case("cuda", "triton"), id="cuda-triton", marks=[pytest.mark.cuda, needs_cuda]),
    pytest.param(Case("cuda", "eager"), id="cuda-eager", marks=[pytest.mark.cuda, needs_cuda]),
]


@pytest.fixture(params=CASES)
def case(request: pytest.FixtureRequest) -> Case:
    value: Case = request.param
    return value


@pytest.fixture
def poisoned() -> Iterator[None]:
    """Fresh ``empty`` allocations are filled with NaN for the test (numeric tests ask for it;
    compile and opcheck tests do not, since tracing must see the real ``torch.empty``)."""
    with nan_poisoned_allocations():
        yield


@pytest.fixture(autouse=True)
def seeded() -> None:
    torch.manual_seed(0)


@pytest.fixture
def refused_wrapper_launches(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """``torch.library.wrap_triton`` replaced by a wrapper that records the kernel it wraps and
    fails if a launch goes through it; returns the recorded kernels. Launchers must still ask
    ``wrap_triton`` (launch recorders hook it) but launch the kernel itself in eager mode."""
    wrapped: list[object] = []

    class _RefusingWrapper:
        def __init__(self, kernel: object) -> None:
            self.kernel = kernel
            wrapped.append(kernel)

        def __getitem__(self, grid: object) -> None:
            raise AssertionError("launched through the wrap_triton wrapper")

    monkeypatch.setattr(torch.library, "wrap_triton", _RefusingWrapper)
    return wrapped


ScanFn = Callable[..., Tensor]


def sequential_with_grads(
    sequential: ScanFn, jac: Tensor, rhs: Tensor, h0: Tensor | None, grad_y: Tensor, reverse: bool
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """The oracle: a float64 step loop, gradients by autograd through the loop."""
    j = jac.detach().double().requires_grad_()
    r = rhs.detach().double().requires_grad_()
    h = h0.detach().double().requires_grad_() if h0 is not None else None
    y = sequential(j, r, h, reverse=reverse)
    inputs = [j, r] + ([h] if h is not None else [])
    grads = torch.autograd.grad(y, inputs, grad_y.double())
    return y.detach(), grads[0], grads[1], (grads[2] if h is not None else None)


def check_against_sequential(
    op: ScanFn,
    sequential: ScanFn,
    jac: Tensor,
    rhs: Tensor,
    h0: Tensor | None,
    grad_y: Tensor,
    *,
    reverse: bool,
    backend: str,
    forward_tol: float,
    grad_tol: float,
    label: str,
) -> None:
    """``op`` (a public scan) against the float64 loop: output dtype, forward, every gradient."""
    ref_y, ref_gj, ref_gr, ref_gh = sequential_with_grads(sequential, jac, rhs, h0, grad_y, reverse)
    jac_leaf, rhs_leaf = (t.clone().requires_grad_() for t in (jac, rhs))
    h0_leaf = h0.clone().requires_grad_() if h0 is not None else None
    y = op(jac_leaf, rhs_leaf, h0_leaf, reverse=reverse, backend=backend)
    assert y.dtype == rhs.dtype
    assert_close(y, ref_y, tol=forward_tol, name=f"y {label}")
    y.backward(grad_y)
    assert_close(jac_leaf.grad, ref_gj, tol=grad_tol, name=f"grad jac {label}")
    assert_close(rhs_leaf.grad, ref_gr, tol=grad_tol, name=f"grad rhs {label}")
    if h0_leaf is not None:
        assert ref_gh is not None
        assert_close(h0_leaf.grad, ref_gh, tol=grad_tol, name=f"grad h0 {label}")
