"""``linear_tf32x3`` against a float64 ``F.linear``: forward and every gradient, awkward sizes,
split reductions, bitwise-repeatable gradients on the GPU, and its errors."""

from __future__ import annotations

from collections.abc import Iterator
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from pararnn_kernels import linear_tf32x3
from pararnn_kernels.dispatch import triton_interpret_mode
from pararnn_kernels.linear import AUTO_MIN_ROWS, ops, plan_gemm, resolve_linear_backend
from pararnn_kernels.testing import assert_close

from .conftest import needs_cuda, needs_interpreter

#: The interpreter multiplies in float32 (no TF32 split), so its error is an IEEE GEMM's.
INTERPRETER_TOL = 1e-5
#: On the GPU: how many times PyTorch's IEEE float32 GEMM's error (against float64, on the same
#: operands) the tf32x3 products may be off, and the floor of that bound (relative to the
#: largest reference element).
IEEE_FACTOR = 4.0
GPU_TOL_FLOOR = 2e-6

DEVICES = [
    pytest.param("cpu", id="interpreter", marks=needs_interpreter),
    pytest.param("cuda", id="cuda", marks=[pytest.mark.cuda, needs_cuda]),
]


@pytest.fixture
def ieee_float32() -> Iterator[None]:
    """PyTorch's float32 GEMMs in IEEE float32 (no TF32) for the test."""
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


def _linear_with_grads(
    x: Tensor, weight: Tensor, bias: Tensor | None, grad_y: Tensor, *, dtype: torch.dtype,
    backend: str,
) -> list[Tensor]:  # fmt: skip
    """``[y, ∂L/∂x, ∂L/∂weight(, ∂L/∂bias)]`` of ``linear_tf32x3`` on leaf copies in ``dtype``."""
    leaves = [t.detach().to(dtype).requires_grad_() for t in (x, weight)]
    bias_leaf = None if bias is None else bias.detach().to(dtype).requires_grad_()
    y = linear_tf32x3(leaves[0], leaves[1], bias_leaf, backend=backend)
    y.backward(grad_y.to(dtype))
    grads = [leaves[0].grad, leaves[1].grad] + ([] if bias_leaf is None else [bias_leaf.grad])
    assert all(g is not None for g in grads)
    return [y.detach(), *(g for g in grads if g is not None)]


def _tolerance(device: str, ieee: Tensor, want: Tensor) -> float:
    if device == "cpu":
        return INTERPRETER_TOL
    scale = max(want.abs().max().item(), 1e-30)
    ieee_error = (ieee.double() - want).abs().max().item() / scale
    return max(IEEE_FACTOR * ieee_error, GPU_TOL_FLOOR)


NAMES = ["y", "grad x", "grad weight", "grad bias"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize(
    ("x_shape", "d_out"),
    [((1, 63), 45), ((3, 17, 63), 45), ((2, 1000, 96), 200), ((8, 4096, 256), 768)],
    ids=["1x63", "3x17x63", "2x1000x96", "8x4096x256"],
)
def test_linear_matches_float64(
    device: str,
    with_bias: bool,
    x_shape: tuple[int, ...],
    d_out: int,
    poisoned: None,
    ieee_float32: None,
) -> None:
    """Forward and the gradients of x, weight and bias against float64; on the GPU within
    IEEE_FACTOR times PyTorch's IEEE float32 GEMM's error on the same operands."""
    if device == "cpu" and x_shape[-2] >= 1000:
        pytest.skip("keeps the interpreter run short")
    x = torch.randn(*x_shape, device=device)
    weight = torch.randn(d_out, x_shape[-1], device=device) / 8
    bias = torch.randn(d_out, device=device) if with_bias else None
    grad_y = torch.randn(*x_shape[:-1], d_out, device=device)
    got = _linear_with_grads(x, weight, bias, grad_y, dtype=torch.float32, backend="triton")
    want = _linear_with_grads(x, weight, bias, grad_y, dtype=torch.float64, backend="eager")
    ieee = _linear_with_grads(x, weight, bias, grad_y, dtype=torch.float32, backend="eager")
    for name, g, w, i in zip(NAMES[: len(want)], got, want, ieee, strict=True):
        assert g.dtype == torch.float32, name
        assert_close(g, w, tol=_tolerance(device, i, w), name=f"{name} {x_shape}")


@needs_interpreter
def test_split_reduction_matches_float64(poisoned: None) -> None:
    """A product with few output tiles and a long reduction (1100 inputs) is split into slices
    (the interpreter counts 4 multiprocessors), the last one partial; their sum is the same."""
    x = torch.randn(20, 1100)
    weight = torch.randn(24, 1100)
    bias = torch.randn(24)
    assert plan_gemm(20, 24, 1100, x.device).splits == 2
    grad_y = torch.randn(20, 24)
    got = _linear_with_grads(x, weight, bias, grad_y, dtype=torch.float32, backend="triton")
    want = _linear_with_grads(x, weight, bias, grad_y, dtype=torch.float64, backend="eager")
    for name, g, w in zip(NAMES, got, want, strict=True):
        assert_close(g, w, tol=INTERPRETER_TOL, name=name)


@needs_interpreter
def test_only_the_asked_gradients(poisoned: None) -> None:
    """A frozen weight and bias: only ∂L/∂x; an input that needs none: only the weight's; a
    trainable bias alone: only its gradient."""
    x = torch.randn(5, 7, requires_grad=True)
    weight, bias = torch.randn(3, 7), torch.randn(3)
    linear_tf32x3(x, weight, bias, backend="triton").sum().backward()
    assert x.grad is not None and weight.grad is None and bias.grad is None
    assert_close(x.grad, weight.double().sum(0).expand(5, 7), tol=INTERPRETER_TOL, name="grad x")
    x = torch.randn(5, 7)
    weight.requires_grad_()
    linear_tf32x3(x, weight, None, backend="triton").sum().backward()
    assert weight.grad is not None
    assert_close(weight.grad, x.double().sum(0).expand(3, 7), tol=INTERPRETER_TOL, name="grad w")
    weight = torch.randn(3, 7)
    bias.requires_grad_()
    grad_y = torch.randn(5, 3)
    linear_tf32x3(x, weight, bias, backend="triton").backward(grad_y)
    assert bias.grad is not None
    assert_close(bias.grad, grad_y.double().sum(0), tol=INTERPRETER_TOL, name="grad bias")


def test_auto_takes_f_linear_off_the_gpu_and_for_other_dtypes() -> None:
    """``"auto"`` runs the kernel only for float32 CUDA operands: on the CPU (interpreter or
    not) and for float64 it is ``F.linear``, to the bit."""
    for dtype in (torch.float32, torch.float64):
        x, weight, bias = torch.randn(4, 6, dtype=dtype), torch.randn(5, 6, dtype=dtype), None
        assert resolve_linear_backend("auto", x, weight, bias) == "eager"
        assert torch.equal(linear_tf32x3(x, weight), F.linear(x, weight))


def test_auto_traces_as_f_linear() -> None:
    """Under ``torch.compile`` (``fullgraph``: no graph break) ``"auto"`` is ``F.linear``."""
    x, weight, bias = torch.randn(4, 6), torch.randn(5, 6), torch.randn(5)
    compiled = torch.compile(
        lambda a: linear_tf32x3(a, weight, bias), backend="eager", fullgraph=True
    )
    assert torch.equal(compiled(x), F.linear(x, weight, bias))


@pytest.mark.cuda
@needs_cuda
def test_auto_follows_the_float32_matmul_precision() -> None:
    """Under ``"highest"`` float32 CUDA operands of AUTO_MIN_ROWS rows or more take the kernel;
    fewer rows, ``"high"`` (TF32 asked for) and bfloat16 take ``F.linear``."""
    x = torch.randn(2, AUTO_MIN_ROWS // 2, 6, device="cuda")
    weight = torch.randn(5, 6, device="cuda")
    previous = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        expected = "triton" if torch.cuda.get_device_capability() >= (8, 0) else "eager"
        assert resolve_linear_backend("auto", x, weight, None) == expected
        # A few rows (a decoding step's projection): F.linear.
        assert resolve_linear_backend("auto", x[:, :3], weight, None) == "eager"
        torch.set_float32_matmul_precision("high")
        assert resolve_linear_backend("auto", x, weight, None) == "eager"
    finally:
        torch.set_float32_matmul_precision(previous)
    half = x.bfloat16(), weight.bfloat16()
    assert resolve_linear_backend("auto", *half, None) == "eager"


def test_bad_inputs_name_the_argument() -> None:
    x, weight, bias = torch.randn(4, 6), torch.randn(5, 6), torch.randn(5)
    with pytest.raises(ValueError, match=r"backend must be one of .*got 'cublas'"):
        linear_tf32x3(x, weight, bias, backend="cublas")
    with pytest.raises(ValueError, match=r"x must have shape \[..., d_in\] with d_in = .* 6"):
        linear_tf32x3(torch.randn(4, 7), weight, bias)
    with pytest.raises(ValueError, match=r"weight must have 2 dimensions"):
        linear_tf32x3(x, weight[0], bias)
    with pytest.raises(ValueError, match=r"bias must have shape \[d_out\] = \(5,\), got \(4,\)"):
        linear_tf32x3(x, weight, bias[:4])
    with pytest.raises(TypeError, match=r"x must be a torch.Tensor, got NoneType"):
        linear_tf32x3(None, weight, bias)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"bias must be on x's device cpu, got meta"):
        linear_tf32x3(x, weight, bias.to("meta"))
    with pytest.raises(TypeError, match=r"weight must be a torch.Tensor, got list"):
        linear_tf32x3(x, [[1.0]], bias)  # type: ignore[arg-type]
    # Without the interpreter the CPU is what is missing first; with it, the dtype.
    missing = "float32 operands, got" if triton_interpret_mode() else "CUDA tensors"
    with pytest.raises(ValueError, match=rf"backend='triton' needs {missing}"):
        linear_tf32x3(x.double(), weight.double(), backend="triton")


@needs_interpreter
def test_backward_is_differentiable_once() -> None:
    """The kernel's backward runs outside autograd: a gradient taken with ``create_graph=True``
    cannot be differentiated again (``backend="eager"`` can), and says so."""
    x = torch.randn(4, 6, requires_grad=True)
    weight = torch.randn(5, 6, requires_grad=True)
    (grad_x,) = torch.autograd.grad(
        linear_tf32x3(x, weight, backend="triton").square().sum(), x, create_graph=True
    )
    with pytest.raises(RuntimeError, match="differentiate twice"):
        grad_x.sum().backward()
    (grad_x,) = torch.autograd.grad(
        linear_tf32x3(x, weight, backend="eager").square().sum(), x, create_graph=True
    )
    grad_x.sum().backward()
    assert weight.grad is not None


def test_gemm_plan_takes_64_step_stages_where_shared_memory_holds_them() -> None:
    """Three stages of 128 x 64 float32 tiles (192 KiB) on compute capability 9.x and 10.x; 32
    steps elsewhere (Ampere's 163 KiB, the consumer cards' 99 KiB), and on the CPU."""
    cpu = torch.device("cpu")
    cases = [(None, 32), ((8, 0), 32), ((8, 9), 32), ((9, 0), 64), ((10, 0), 64), ((12, 0), 32)]
    for capability, block_k in cases:
        with mock.patch.object(ops, "device_capability", return_value=capability):
            plan = plan_gemm(32768, 768, 256, cpu)
        shape = (plan.block_m, plan.block_n, plan.block_k, plan.num_warps, plan.stages)
        assert shape == (128, 128, block_k, 8, 3), capability
        assert plan.splits == 1


@needs_interpreter
def test_64_step_stages_match_float64(poisoned: None) -> None:
    """The compute capability 9.x plan (64 steps of the reduction per stage) on the interpreter:
    a reduction shorter than one step, and a split one whose last slice is partial."""
    with mock.patch.object(ops, "device_capability", return_value=(9, 0)):
        assert plan_gemm(20, 24, 1100, torch.device("cpu")).block_k == 64
        for rows, d_in, d_out in [(17, 63, 45), (20, 1100, 24)]:
            x = torch.randn(rows, d_in)
            weight = torch.randn(d_out, d_in)
            bias = torch.randn(d_out)
            grad_y = torch.randn(rows, d_out)
            got = _linear_with_grads(x, weight, bias, grad_y, dtype=torch.float32, backend="triton")
            want = _linear_with_grads(x, weight, bias, grad_y, dtype=torch.float64, backend="eager")
            for name, g, w in zip(NAMES, got, want, strict=True):
                assert_close(g, w, tol=INTERPRETER_TOL, name=f"{name} [{rows}, {d_in}]")


@pytest.mark.cuda
@needs_cuda
def test_gpu_results_are_bitwise_repeatable() -> None:
    """A split reduction sums its slices in a fixed order: the same bits every time, forward and
    every gradient."""
    x = torch.randn(512, 16384, device="cuda", requires_grad=True)
    weight = torch.randn(128, 16384, device="cuda", requires_grad=True)
    bias = torch.randn(128, device="cuda", requires_grad=True)
    grad_y = torch.randn(512, 128, device="cuda")
    assert plan_gemm(512, 128, 16384, x.device).splits > 1

    def run() -> list[Tensor]:
        x.grad = weight.grad = bias.grad = None
        y = linear_tf32x3(x, weight, bias, backend="triton")
        y.backward(grad_y)
        grads = [x.grad, weight.grad, bias.grad]
        assert all(g is not None for g in grads)
        return [y.detach(), *(g for g in grads if g is not None)]

    first = run()
    for _ in range(10):
        for name, got, want in zip(NAMES, run(), first, strict=True):
            assert torch.equal(got, want), name
