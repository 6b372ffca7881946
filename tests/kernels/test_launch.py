"""Relaunching compiled kernels: the key separates what Triton's specialization separates, and a
launch reaches the compiled kernel only for arguments of a kind Triton already compiled for."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from pararnn_kernels import scan_diag, sequential_scan_diag
from pararnn_kernels._launch import _launch_key, _Relauncher
from pararnn_kernels.testing import assert_close

from .conftest import needs_cuda


@pytest.fixture
def device_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    """The key reads the current CUDA device; on a machine without one, device 0."""
    if not torch.cuda.is_available():
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


class _Count(int):
    """An int subclass (as IntEnum members are)."""


def _tensor_at(offset: int, n: int = 32) -> torch.Tensor:
    """A contiguous float32 tensor whose data starts ``offset`` elements into an allocation."""
    return torch.zeros(n + offset)[offset:]


def test_key_separates_what_triton_specializes(device_zero: None) -> None:
    aligned, shifted = _tensor_at(0), _tensor_at(1)
    assert aligned.data_ptr() % 16 == 0 and shifted.data_ptr() % 16 != 0
    base = _launch_key((aligned, 48), {"BLOCK": 64, "num_warps": 1})
    assert base is not None
    assert base == _launch_key((_tensor_at(4), 32), {"BLOCK": 64, "num_warps": 1})
    different = [
        ((shifted, 48), {"BLOCK": 64, "num_warps": 1}),  # alignment
        ((aligned.double(), 48), {"BLOCK": 64, "num_warps": 1}),  # dtype
        ((aligned, 45), {"BLOCK": 64, "num_warps": 1}),  # divisibility by 16
        ((aligned, 1), {"BLOCK": 64, "num_warps": 1}),  # the value 1
        ((aligned, 2**31 + 16), {"BLOCK": 64, "num_warps": 1}),  # 64-bit integer
        ((aligned, 48), {"BLOCK": 32, "num_warps": 1}),  # a constexpr
        ((aligned, 48), {"BLOCK": 64, "num_warps": 2}),  # a launch option
        ((aligned, 48.0), {"BLOCK": 64, "num_warps": 1}),  # a float
        ((aligned, True), {"BLOCK": 64, "num_warps": 1}),  # a bool
    ]
    keys = [_launch_key(args, kwargs) for args, kwargs in different]
    assert all(key is not None for key in keys)
    assert len({base, *keys}) == len(keys) + 1
    # Subclasses of the launchers' exact argument types are classified as their base types.
    parameter = torch.nn.Parameter(aligned, requires_grad=False)
    assert _launch_key((parameter, 48), {"BLOCK": 64, "num_warps": 1}) == base
    assert _launch_key((aligned, _Count(48)), {"BLOCK": 64, "num_warps": 1}) == base
    # A hashable keyword value of another type (a tuple) is kept by value.
    shaped = _launch_key((aligned, 48), {"BLOCK": 64, "num_warps": 1, "shape": (1, 2)})
    assert shaped is not None and shaped != base


def test_key_of_tma_descriptors_separates_dtype_and_block(device_zero: None) -> None:
    """Host TMA descriptors (the streamed scan's) relaunch by their base's dtype and block
    shape; their shape and strides are launch arguments, which a relaunch passes anew."""
    descriptor = pytest.importorskip("triton.tools.tensor_descriptor").TensorDescriptor
    rows = torch.zeros(8, 64, 32)
    base = _launch_key((descriptor.from_tensor(rows, [1, 16, 32]), 64), {"BLOCK_T": 16})
    assert base is not None
    longer = torch.zeros(4, 128, 32)
    same = _launch_key((descriptor.from_tensor(longer, [1, 16, 32]), 64), {"BLOCK_T": 16})
    assert same == base
    different = [
        _launch_key((descriptor.from_tensor(rows.bfloat16(), [1, 16, 32]), 64), {"BLOCK_T": 16}),
        _launch_key((descriptor.from_tensor(rows, [1, 32, 32]), 64), {"BLOCK_T": 16}),
        _launch_key((rows, 64), {"BLOCK_T": 16}),
    ]
    assert all(key is not None for key in different)
    assert len({base, *different}) == len(different) + 1


def test_key_refuses_arguments_it_cannot_classify(device_zero: None) -> None:
    aligned = _tensor_at(0)
    assert _launch_key((aligned, None), {}) is None
    assert _launch_key((aligned, "x"), {}) is None
    assert _launch_key((aligned,), {"other": aligned}) is None
    assert _launch_key((aligned,), {"shape": [1, 2]}) is None


class _FakeCompiled:
    def __init__(self, log: list[tuple[str, Any]]) -> None:
        self.log = log
        self.function = object()

    def __getitem__(self, grid: Any) -> Any:
        # As Triton's CompiledKernel: the runner reads three grid dimensions.
        return lambda *args: self.log.append(("compiled", (grid[0], grid[1], grid[2], *args)))


class _FakeKernel:
    arg_names = ("x", "n", "BLOCK")

    def __init__(self) -> None:
        self.log: list[tuple[str, Any]] = []

    def __getitem__(self, grid: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> _FakeCompiled:
            self.log.append(("triton", (args, kwargs)))
            return _FakeCompiled(self.log)

        return run


def test_relauncher_uses_the_compiled_kernel_only_for_the_same_kind(device_zero: None) -> None:
    kernel = _FakeKernel()
    relauncher = _Relauncher(kernel)
    aligned, other, shifted = _tensor_at(0), _tensor_at(8), _tensor_at(1)
    relauncher[(1,)](aligned, 64, BLOCK=16, num_warps=1)
    relauncher[(5,)](other, 80, BLOCK=16, num_warps=1)
    relauncher[(1,)](shifted, 64, BLOCK=16, num_warps=1)
    relauncher[(1,)](other, 65, BLOCK=16, num_warps=1)
    relauncher[(1,)](other, 64, BLOCK=32, num_warps=1)
    relauncher[(2, 3)](aligned, 96, BLOCK=32, num_warps=1)
    kinds = [kind for kind, _ in kernel.log]
    assert kinds == ["triton", "compiled", "triton", "triton", "triton", "compiled"]
    # The compiled kernel gets a three-dimensional grid and every parameter in signature
    # order, constexprs included.
    assert kernel.log[1][1] == (5, 1, 1, other, 80, 16)
    assert kernel.log[5][1] == (2, 3, 1, aligned, 96, 32)
    # A parameter left to its default is not known to the relaunch: Triton's path each time.
    relauncher[(1,)](aligned, 64, num_warps=1)
    relauncher[(1,)](aligned, 64, num_warps=1)
    assert [kind for kind, _ in kernel.log[6:]] == ["triton", "triton"]


@pytest.mark.cuda
@needs_cuda
def test_relaunched_scans_follow_alignment_and_sizes() -> None:
    """Scans whose inputs alternate between aligned and misaligned starts and sizes that do and
    do not divide by 16 (each a different Triton specialization), against the float64 loop."""
    for channels in (48, 45, 48, 45):
        for offset in (0, 1, 0):
            n = 3 * 100 * channels
            jac = (0.9 * torch.rand(n + offset, device="cuda"))[offset:].view(3, 100, channels)
            rhs = torch.randn(n + offset, device="cuda")[offset:].view(3, 100, channels)
            assert jac.is_contiguous() and (jac.data_ptr() % 16 == 0) == (offset == 0)
            y = scan_diag(jac, rhs, backend="triton")
            ref = sequential_scan_diag(jac.double(), rhs.double())
            assert_close(y, ref, tol=1e-5, name=f"y D={channels} offset={offset}")


@pytest.mark.cuda
@needs_cuda
def test_relaunched_streamed_scans_follow_lengths_and_widths() -> None:
    """The streamed pass (host TMA descriptors) relaunched across lengths and widths of the
    same kind, each against the float64 loop."""
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the streamed pass needs compute capability >= 9.0")
    from pararnn_kernels.scan import launch

    for steps, channels in ((100, 64), (37, 96), (100, 64), (200, 32)):
        jac = 0.9 * torch.rand(3, steps, channels, device="cuda")
        rhs = torch.randn(3, steps, channels, device="cuda")
        y = launch.triton_scan_diag(jac, rhs, None, reverse=False, method="streamed")
        ref = sequential_scan_diag(jac.double(), rhs.double())
        assert_close(y, ref, tol=1e-5, name=f"y T={steps} D={channels}")
