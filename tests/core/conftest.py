"""Shared helpers for the pararnn-core tests: closeness checks that say where they fail, and
float64 copies of cells (the reference precision)."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from torch import Tensor

import pararnn_core as pc
from pararnn_kernels import testing

CloseCheck = Callable[..., None]


def check_close(
    actual: Tensor, expected: Tensor, *, atol: float = 0.0, rtol: float = 0.0, what: str = ""
) -> None:
    """Elementwise ``|a - e| <= atol + rtol |e|``; on failure name the first bad index."""
    testing.assert_elementwise_close(actual, expected, atol=atol, rtol=rtol, name=what)


def check_rel_close(actual: Tensor, expected: Tensor, *, rel: float, what: str = "") -> None:
    """``max |a - e| <= rel * max |e|`` (relative to the tensor's scale), naming the first bad index."""
    testing.assert_close(actual, expected, tol=rel, name=f"{what} (relative {rel:g})")


@pytest.fixture
def assert_close() -> CloseCheck:
    return check_close


@pytest.fixture
def assert_rel_close() -> CloseCheck:
    return check_rel_close


def cell_copy(
    cell: pc.ParaCell, dtype: torch.dtype, device: str | torch.device = "cpu"
) -> pc.ParaCell:
    """A copy of ``cell`` with its parameters cast (the same numbers in another precision)."""
    return copy.deepcopy(cell).to(device=device, dtype=dtype)


@pytest.fixture
def to_dtype() -> Callable[..., pc.ParaCell]:
    return cell_copy


def random_state(
    cell: pc.ParaCell, batch: int, dtype: torch.dtype, *, scale: float = 0.3
) -> Tensor:
    """A non-trivial initial state: the empty state plus noise (in ``[-1, 1]`` for the h parts)."""
    state = cell.initial_state(batch, dtype=dtype)
    noise = scale * torch.randn(batch, *cell.state_shape, dtype=dtype).clamp(-2, 2)
    if isinstance(cell, pc.ParaSLSTM):
        state[..., 1] = torch.randn(batch, cell.d_h, dtype=dtype)  # a finite log-normaliser
        noise[..., 1] = 0
    return state + noise


@pytest.fixture
def make_state() -> Callable[..., Tensor]:
    return random_state


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
