"""Test helpers shared by the ParaRNN test suites (no test framework imported here).

* :func:`assert_close` -- relative error against a (float64) reference, with a report of the
  first mismatching elements on failure instead of a bare ``False``.
* :func:`assert_elementwise_close` -- ``|a - e| <= atol + rtol |e|`` element by element, with the
  same kind of report.
* :func:`nan_poisoned_allocations` -- while active, every fresh floating ``torch.empty`` /
  ``torch.empty_like`` / ``Tensor.new_empty`` allocation is filled with NaN, so an output element
  a kernel forgot to write shows up at once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "assert_close",
    "assert_elementwise_close",
    "max_relative_error",
    "nan_poisoned_allocations",
]


def max_relative_error(actual: Tensor, expected: Tensor) -> float:
    """``max|actual - expected| / max(max|expected|, tiny)``, computed in float64.

    NaN or inf anywhere in ``actual`` gives ``inf``.
    """
    a = actual.detach().to(torch.float64).cpu()
    e = expected.detach().to(torch.float64).cpu()
    if not torch.isfinite(a).all():
        return float("inf")
    scale = max(e.abs().max().item(), 1e-30) if e.numel() else 1.0
    return (a - e).abs().max().item() / scale if e.numel() else 0.0


def assert_close(actual: Tensor, expected: Tensor, *, tol: float, name: str = "value") -> None:
    """Assert ``max_relative_error(actual, expected) <= tol`` and shapes agree.

    On failure the message names ``name``, the error, the tolerance and the first five
    mismatching indices with both values.
    """
    if tuple(actual.shape) != tuple(expected.shape):
        raise AssertionError(
            f"{name}: shape {tuple(actual.shape)} != expected {tuple(expected.shape)}"
        )
    err = max_relative_error(actual, expected)
    if err <= tol:
        return
    a = actual.detach().to(torch.float64).cpu()
    e = expected.detach().to(torch.float64).cpu()
    scale = max(e.abs().max().item(), 1e-30)
    bad = ~((a - e).abs() <= tol * scale)
    idx = bad.nonzero()[:5]
    rows = [
        f"  at {tuple(int(i) for i in ix)}: got {a[tuple(ix)].item():.8g}, "
        f"expected {e[tuple(ix)].item():.8g}"
        for ix in idx
    ]
    raise AssertionError(
        f"{name}: max relative error {err:.3e} > tol {tol:.1e} "
        f"({int(bad.sum())} of {bad.numel()} elements off)\n" + "\n".join(rows)
    )


def assert_elementwise_close(
    actual: Tensor, expected: Tensor, *, atol: float = 0.0, rtol: float = 0.0, name: str = "value"
) -> None:
    """Assert ``|actual - expected| <= atol + rtol |expected|`` everywhere (NaN fails).

    On failure the message names ``name``, how many elements are off, the first of them with
    both values and its bound, and the largest difference.
    """
    a = actual.detach().to(torch.float64).cpu()
    e = expected.detach().to(torch.float64).cpu()
    if tuple(a.shape) != tuple(e.shape):
        raise AssertionError(f"{name}: shape {tuple(a.shape)} != expected {tuple(e.shape)}")
    err = (a - e).abs()
    bound = atol + rtol * e.abs()
    bad = ~(err <= bound)  # NaN compares False, so it counts as bad
    if not bool(bad.any()):
        return
    idx = tuple(int(i) for i in bad.nonzero()[0])
    raise AssertionError(
        f"{name}: {int(bad.sum())} of {a.numel()} elements differ; first at index {idx}: actual "
        f"{a[idx].item():.9e}, expected {e[idx].item():.9e} (|diff| {err[idx].item():.3e} > "
        f"{bound[idx].item():.3e}); max |diff| {err.max().item():.3e}"
    )


@contextlib.contextmanager
def nan_poisoned_allocations() -> Iterator[None]:
    """Fill every fresh floating ``empty`` allocation with NaN while the context is active."""
    empty, empty_like, new_empty = torch.empty, torch.empty_like, Tensor.new_empty

    def poison(t: Tensor) -> Tensor:
        if t.is_floating_point() and t.numel():
            t.fill_(float("nan"))
        return t

    def poisoned_empty(*args: Any, **kwargs: Any) -> Tensor:
        return poison(empty(*args, **kwargs))

    def poisoned_empty_like(*args: Any, **kwargs: Any) -> Tensor:
        return poison(empty_like(*args, **kwargs))

    def poisoned_new_empty(self: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        return poison(new_empty(self, *args, **kwargs))

    setattr(torch, "empty", poisoned_empty)  # noqa: B010 (keeps mypy out of torch's overloads)
    setattr(torch, "empty_like", poisoned_empty_like)  # noqa: B010
    setattr(Tensor, "new_empty", poisoned_new_empty)  # noqa: B010
    try:
        yield
    finally:
        setattr(torch, "empty", empty)  # noqa: B010
        setattr(torch, "empty_like", empty_like)  # noqa: B010
        setattr(Tensor, "new_empty", new_empty)  # noqa: B010
