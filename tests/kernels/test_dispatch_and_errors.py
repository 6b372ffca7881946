"""Backend and dtype dispatch, and the errors bad input gets."""

from __future__ import annotations

import re

import pytest
import torch

from pararnn_kernels import dispatch, scan_block_diag, scan_diag
from pararnn_kernels.dispatch import resolve_scan_backend

CPU = torch.device("cpu")
FAKE_CUDA = torch.device("cuda", 0)


@pytest.fixture
def old_card(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pretend cuda:0 is a compute-capability 7.5 card (no bf16 in the kernels)."""
    monkeypatch.setitem(dispatch._CAPABILITY, 0, (7, 5))


@pytest.fixture
def new_card(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(dispatch._CAPABILITY, 0, (9, 0))


def test_auto_is_eager_on_cpu_and_for_float64() -> None:
    assert resolve_scan_backend("auto", CPU, torch.float32) == "eager"
    assert resolve_scan_backend("auto", FAKE_CUDA, torch.float64) == "eager"


def test_auto_is_triton_on_cuda(new_card: None) -> None:
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        assert resolve_scan_backend("auto", FAKE_CUDA, dtype) == "triton"


def test_bf16_below_capability_8(old_card: None) -> None:
    assert resolve_scan_backend("auto", FAKE_CUDA, torch.bfloat16) == "eager"
    assert resolve_scan_backend("auto", FAKE_CUDA, torch.float16) == "triton"
    with pytest.raises(ValueError, match=r"compute capability >= 8\.0.*has 7\.5"):
        resolve_scan_backend("triton", FAKE_CUDA, torch.bfloat16)


def test_unknown_backend_lists_known_ones() -> None:
    with pytest.raises(ValueError, match=re.escape("'auto', 'triton', 'eager'; got 'cuda'")):
        resolve_scan_backend("cuda", CPU, torch.float32)
    with pytest.raises(ValueError, match="got 'fast'"):
        scan_diag(torch.ones(1, 2, 3), torch.ones(1, 2, 3), backend="fast")


def test_triton_float64_is_refused(new_card: None) -> None:
    with pytest.raises(ValueError, match=r"got torch.float64"):
        resolve_scan_backend("triton", FAKE_CUDA, torch.float64)


def test_triton_on_cpu_needs_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="needs CUDA tensors, got device cpu"):
        resolve_scan_backend("triton", CPU, torch.float32)


def test_capability_is_not_read_at_import() -> None:
    # Nothing asked for a CUDA device on this path: the caches stay as tests left them.
    assert dispatch.device_capability(CPU) is None
    assert dispatch.multiprocessor_count(CPU) == 4


# ----------------------------------------------------------------------------------------------
# Bad input
# ----------------------------------------------------------------------------------------------


def ok_diag() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.rand(2, 5, 3), torch.randn(2, 5, 3), torch.randn(2, 3)


def test_diag_rank() -> None:
    with pytest.raises(ValueError, match=r"rhs must have 3 dimensions \[B, T, D\], got 2"):
        scan_diag(torch.ones(5, 3), torch.ones(5, 3))


def test_diag_jac_shape() -> None:
    jac, rhs, _ = ok_diag()
    with pytest.raises(
        ValueError, match=r"jac must have shape \[B, T, D\] = \(2, 5, 3\), got \(2, 4, 3\)"
    ):
        scan_diag(jac[:, :4], rhs)


def test_diag_h0_shape() -> None:
    jac, rhs, h0 = ok_diag()
    with pytest.raises(ValueError, match=r"h0 must have shape \[B, D\] = \(2, 3\), got \(3,\)"):
        scan_diag(jac, rhs, h0[0])


def test_integer_dtypes() -> None:
    jac, rhs, _ = ok_diag()
    with pytest.raises(TypeError, match=r"rhs must have a floating dtype .* got torch.int64"):
        scan_diag(jac, torch.ones(2, 5, 3, dtype=torch.int64))
    with pytest.raises(TypeError, match=r"jac must have a floating dtype .* got torch.int32"):
        scan_diag(jac.int(), rhs)


def test_dtype_mismatch() -> None:
    jac, rhs, h0 = ok_diag()
    with pytest.raises(
        TypeError, match=r"jac must have rhs's dtype torch.float32, got torch.float64"
    ):
        scan_diag(jac.double(), rhs)
    with pytest.raises(
        TypeError, match=r"h0 must have rhs's dtype torch.float32, got torch.float16"
    ):
        scan_diag(jac, rhs, h0.half())


def test_device_mismatch() -> None:
    jac, rhs, h0 = ok_diag()
    with pytest.raises(ValueError, match="h0 must be on rhs's device cpu, got meta"):
        scan_diag(jac, rhs, h0.to("meta"))


def test_not_a_tensor() -> None:
    _, rhs, _ = ok_diag()
    with pytest.raises(TypeError, match=r"jac must be a torch.Tensor, got list"):
        scan_diag([1.0], rhs)  # type: ignore[arg-type]


def test_empty_sequence() -> None:
    with pytest.raises(ValueError, match=r"non-empty .* got \(2, 0, 3\)"):
        scan_diag(torch.ones(2, 0, 3), torch.ones(2, 0, 3))


def test_block_shapes() -> None:
    jac, rhs, h0 = torch.rand(2, 5, 3, 2, 2), torch.randn(2, 5, 3, 2), torch.randn(2, 3, 2)
    with pytest.raises(ValueError, match=r"rhs must have 4 dimensions \[B, T, D, k\], got 3"):
        scan_block_diag(jac, rhs[..., 0], h0)
    with pytest.raises(
        ValueError, match=r"jac must have shape \[B, T, D, k, k\] = \(2, 5, 3, 3, 3\)"
    ):
        scan_block_diag(jac, torch.randn(2, 5, 3, 3))
    with pytest.raises(ValueError, match=r"jac must have shape .* got \(2, 5, 3, 2, 3\)"):
        scan_block_diag(torch.rand(2, 5, 3, 2, 3), rhs)
    with pytest.raises(
        ValueError, match=r"h0 must have shape \[B, D, k\] = \(2, 3, 2\), got \(2, 3\)"
    ):
        scan_block_diag(jac, rhs, h0[..., 0])
