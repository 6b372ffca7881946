"""Fixtures for the pararnn-kernels tests: (device, backend) cases and NaN-poisoned allocations."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import torch

from pararnn_kernels.dispatch import triton_interpret_mode
from pararnn_kernels.testing import nan_poisoned_allocations

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
