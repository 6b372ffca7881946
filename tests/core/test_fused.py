"""The fused layer path of pararnn-core: ``scan_backend="fused"``, ``"auto"`` and the eval path.

On the CPU the fused kernels run in the Triton interpreter (small sizes); ``cuda`` tests run them
compiled. References: the float64 sequential recurrence and its BPTT gradients (autograd through
the step loop). float32 tolerance: 1e-5 relative to each tensor's largest reference value.
"""

from __future__ import annotations

import copy

import pytest
import torch

import pararnn_core as pc
from pararnn_kernels.dispatch import triton_interpret_mode

F32, F64 = torch.float32, torch.float64
FUSED = pc.NewtonConfig(scan_backend="fused")
needs_interpreter = pytest.mark.skipif(
    not triton_interpret_mode(), reason="the fused kernels on CPU need TRITON_INTERPRET=1"
)
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _grads(cell, x, h0, weight, run):
    x = x.detach().clone().requires_grad_()
    h0 = h0.detach().clone().requires_grad_()
    states = run(cell, x, h0)
    params = [p for _, p in cell.named_parameters()]
    grads = torch.autograd.grad((states * weight).sum(), [x, h0, *params])
    return states.detach(), grads


def _check_fused_layer(cell32, x, h0, run, assert_rel_close, label):
    cell64 = copy.deepcopy(cell32).to(F64)
    weight = torch.randn(x.shape[0], x.shape[1], cell32.d_h, device=x.device)
    ref_states, ref_grads = _grads(
        cell64, x.double(), h0.double(), weight.double(), pc.sequential_apply
    )
    states, grads = _grads(cell32, x, h0, weight, run)
    assert states.dtype == F32
    assert_rel_close(states, ref_states, rel=1e-5, what=f"{label} states")
    names = ["x", "h0", *(n for n, _ in cell32.named_parameters())]
    for name, g, ref in zip(names, grads, ref_grads, strict=True):
        assert_rel_close(g, ref, rel=1e-5, what=f"{label} grad {name}")


@needs_interpreter
@pytest.mark.parametrize("steps", [1, 17, 63])
def test_fused_newton_equals_sequential_and_bptt(steps, make_state, assert_rel_close):
    cell = pc.ParaGRU(3, 5)
    x = torch.randn(2, steps, 3)
    h0 = make_state(cell, 2, F32)
    stats_seen = []

    def run(c, a, b):
        states, stats = pc.newton_apply(c, a, b, config=FUSED)
        stats_seen.append(stats)
        return states

    _check_fused_layer(cell, x, h0, run, assert_rel_close, f"fused T={steps}")
    stats = stats_seen[0]
    assert stats.backend == "fused" and stats.converged
    assert stats.max_residual <= 1e-6 and len(stats.residuals) == stats.iters + 1


@needs_interpreter
def test_fused_sequential_apply_equals_sequential_and_bptt(make_state, assert_rel_close):
    cell = pc.ParaGRU(3, 5)
    x = torch.randn(2, 17, 3)
    h0 = make_state(cell, 2, F32)
    _check_fused_layer(cell, x, h0, pc.fused_sequential_apply, assert_rel_close, "fused seq")


@needs_interpreter
def test_fused_nan_is_never_silent():
    cell = pc.ParaGRU(3, 4)
    x = torch.randn(2, 10, 3)
    x[1, 4, 0] = float("nan")
    with pytest.raises(pc.NewtonDivergenceError, match="inf"):
        pc.newton_apply(cell, x, config=FUSED)
    with pytest.raises(pc.NewtonDivergenceError, match="not finite either"):
        pc.newton_apply(
            cell, x, config=pc.NewtonConfig(scan_backend="fused", on_divergence="sequential")
        )


@needs_interpreter
def test_fused_sequential_pick_is_never_a_silent_nan():
    """What "auto" runs when its cost model picks the sequential kernel: NaN raises too."""
    cell = pc.ParaGRU(3, 4)
    u = cell.project(torch.randn(2, 10, 3)).detach()
    u[1, 4, 0] = float("nan")
    h0 = torch.zeros(2, 4)
    with pytest.raises(pc.NewtonDivergenceError, match="fused sequential recurrence"):
        pc.fused.fused_newton_apply(cell, u, h0, pc.NewtonConfig(), "fused_sequential")


def test_fused_refuses_cells_without_kernels_and_says_what_to_use():
    assert pc.has_fused_kernels(pc.ParaGRU(3, 4))
    assert not pc.has_fused_kernels(pc.ParaLSTM(3, 4))
    with pytest.raises(ValueError, match="ParaGRU only; got a ParaLSTM: use scan_backend='auto'"):
        pc.newton_apply(pc.ParaLSTM(3, 4), torch.randn(2, 8, 3), config=FUSED)
    with pytest.raises(ValueError, match="use sequential_apply"):
        pc.fused_sequential_apply(pc.ParaSLSTM(3, 4), torch.randn(2, 8, 3))


def test_fused_refuses_float64_naming_the_dtype():
    cell = pc.ParaGRU(3, 4, dtype=F64)
    with pytest.raises(ValueError, match=r"got u of torch\.float64"):
        pc.newton_apply(cell, torch.randn(2, 8, 3, dtype=F64), config=FUSED)


def test_auto_on_cpu_keeps_the_unfused_path():
    _states, stats = pc.newton_apply(pc.ParaGRU(3, 4), torch.randn(2, 8, 3))
    assert stats.backend in ("eager", "triton")


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("steps", [17, 4096])
@pytest.mark.parametrize("backend", ["fused", "auto"])
def test_fused_on_gpu(backend, steps, assert_rel_close):
    cell = pc.ParaGRU(256, 256, device="cuda")
    x = torch.randn(8, steps, 256, device="cuda")
    h0 = 0.3 * torch.randn(8, 256, device="cuda")
    seen = []

    def run(c, a, b):
        states, stats = pc.newton_apply(c, a, b, config=pc.NewtonConfig(scan_backend=backend))
        seen.append(stats)
        return states

    _check_fused_layer(cell, x, h0, run, assert_rel_close, f"cuda {backend} T={steps}")
    assert seen[0].backend in (("fused",) if backend == "fused" else ("fused", "fused_sequential"))


@pytest.mark.cuda
@needs_cuda
def test_eval_mode_uses_the_fused_sequential_kernel(assert_rel_close):
    model = pc.ParaRNN(pc.ParaGRU(64, 128)).cuda()
    x = torch.randn(4, 300, 64, device="cuda")
    model.eval()
    cell = model.cells[0]
    with torch.no_grad():
        y = model(x)
        reference = cell.output(pc.sequential_apply(copy.deepcopy(cell).double(), x.double()))
    assert_rel_close(y, reference, rel=1e-5, what="eval (fused sequential) vs float64 sequential")
