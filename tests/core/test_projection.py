"""The built-in cells' input projection (``ProjectionLinear``): an ``nn.Linear`` with the same
parameters, ``"auto"`` by default (exactly ``F.linear`` on the CPU and with ``"eager"``), and
with ``backend="triton"``/``"auto"`` a layer whose states and every gradient match the float64
sequential recurrence."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import pararnn_core as pc
from pararnn_kernels.dispatch import triton_interpret_mode

F32, F64 = torch.float32, torch.float64
CELLS = [pc.ParaGRU, pc.ParaLSTM, pc.ParaSLSTM]
needs_interpreter = pytest.mark.skipif(
    not triton_interpret_mode(), reason="the Triton kernels on CPU need TRITON_INTERPRET=1"
)
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("cls", CELLS)
def test_projection_is_an_nn_linear_with_the_same_state(cls) -> None:
    cell = cls(5, 7)
    assert isinstance(cell.proj, pc.ProjectionLinear) and isinstance(cell.proj, nn.Linear)
    assert cell.proj.backend == "auto"
    assert {"proj.weight", "proj.bias"} <= set(cell.state_dict())
    x = torch.randn(2, 3, 5)
    # "auto" on the CPU is F.linear, to the bit, and so is "eager" anywhere.
    assert torch.equal(cell.project(x), F.linear(x, cell.proj.weight, cell.proj.bias))
    cell.proj.backend = "eager"
    assert torch.equal(cell.project(x), F.linear(x, cell.proj.weight, cell.proj.bias))


def _layer_grads(cell, x, weight, run):
    x = x.detach().clone().requires_grad_()
    states = run(cell, x)
    grads = torch.autograd.grad((states * weight).sum(), [x, *cell.parameters()])
    return states.detach(), grads


def _check_against_float64(cell, x, backend, run, assert_rel_close, label):
    reference = copy.deepcopy(cell).double()
    weight = torch.randn(x.shape[0], x.shape[1], *cell.state_shape, device=x.device)
    want = _layer_grads(reference, x.double(), weight.double(), pc.sequential_apply)
    cell.proj.backend = backend
    got = _layer_grads(cell, x, weight, run)
    names = ["states", "grad x", *(f"grad {n}" for n, _ in cell.named_parameters())]
    for name, g, w in zip(names, [got[0], *got[1]], [want[0], *want[1]], strict=True):
        assert g.dtype == F32, name
        assert_rel_close(g, w, rel=1e-5, what=f"{label} {name}")


@needs_interpreter
@pytest.mark.parametrize("cls", CELLS)
def test_triton_projection_layer_matches_float64(cls, assert_rel_close) -> None:
    """The projection's GEMMs by the kernel (the interpreter) inside an unfused Newton layer:
    states and every gradient (the projection's weight and bias included) against float64."""
    cell = cls(6, 5)
    x = torch.randn(2, 17, 6)
    config = pc.NewtonConfig(scan_backend="eager", max_iters=17)

    def run(c, a):
        return pc.newton_apply(c, a, config=config)[0]

    _check_against_float64(cell, x, "triton", run, assert_rel_close, cls.__name__)


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("cls", CELLS)
def test_auto_projection_on_gpu_matches_float64(cls, assert_rel_close) -> None:
    """``backend="auto"`` on the GPU (the tensor-core kernel under the default "highest"
    precision) inside the fused layer: states and every gradient against float64."""
    cell = cls(256, 256, device="cuda")
    x = torch.randn(8, 1024, 256, device="cuda")
    config = pc.NewtonConfig(scan_backend="fused", max_iters=12)
    assert torch.get_float32_matmul_precision() == "highest"

    def run(c, a):
        return pc.newton_apply(c, a, config=config)[0]

    _check_against_float64(cell, x, "auto", run, assert_rel_close, f"cuda {cls.__name__}")
