"""The fused layer path of pararnn-core: ``scan_backend="fused"``, ``"auto"`` and the eval path.

On the CPU the fused kernels run in the Triton interpreter (small sizes); ``cuda`` tests run them
compiled. References: the float64 sequential recurrence and its BPTT gradients (autograd through
the step loop). float32 tolerance: 1e-5 relative to each tensor's largest reference value, per
state component for the block cells (the sLSTM's log-normaliser is larger than its ĉ and h).
"""

from __future__ import annotations

import copy

import pytest
import torch

import pararnn_core as pc
from pararnn_core.cells import EMPTY_LOG_NORMALISER
from pararnn_kernels.dispatch import triton_interpret_mode
from pararnn_kernels.fused import SLSTM_EMPTY_LOG_NORMALISER

F32, F64 = torch.float32, torch.float64
FUSED = pc.NewtonConfig(scan_backend="fused")
CELLS = [pc.ParaGRU, pc.ParaLSTM, pc.ParaSLSTM]
needs_interpreter = pytest.mark.skipif(
    not triton_interpret_mode(), reason="the fused kernels on CPU need TRITON_INTERPRET=1"
)
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _grads(cell, x, h0, weight, run):
    x = x.detach().clone().requires_grad_()
    leaves = [x]
    if h0 is not None:
        h0 = h0.detach().clone().requires_grad_()
        leaves.append(h0)
    states = run(cell, x, h0)
    params = [p for _, p in cell.named_parameters()]
    grads = torch.autograd.grad((states * weight).sum(), [*leaves, *params])
    return states.detach(), grads


def _check_fused_layer(cell32, x, h0, run, assert_rel_close, label):
    cell64 = copy.deepcopy(cell32).to(F64)
    weight = torch.randn(x.shape[0], x.shape[1], *cell32.state_shape, device=x.device)
    h0_64 = h0.double() if h0 is not None else None
    ref_states, ref_grads = _grads(cell64, x.double(), h0_64, weight.double(), pc.sequential_apply)
    states, grads = _grads(cell32, x, h0, weight, run)
    assert states.dtype == F32 and states.shape == ref_states.shape
    names = ["x", *(["h0"] if h0 is not None else []), *(n for n, _ in cell32.named_parameters())]
    for name, g, ref in zip(names, grads, ref_grads, strict=True):
        if name == "h0" and g.dim() == 3:
            for j in range(g.shape[-1]):
                assert_rel_close(g[..., j], ref[..., j], rel=1e-5, what=f"{label} grad h0[{j}]")
        else:
            assert_rel_close(g, ref, rel=1e-5, what=f"{label} grad {name}")
    if states.dim() == 4:
        for j in range(states.shape[-1]):
            assert_rel_close(
                states[..., j], ref_states[..., j], rel=1e-5, what=f"{label} states[{j}]"
            )
    else:
        assert_rel_close(states, ref_states, rel=1e-5, what=f"{label} states")


@needs_interpreter
@pytest.mark.parametrize("cls", CELLS)
@pytest.mark.parametrize("steps", [1, 17, 63])
def test_fused_newton_equals_sequential_and_bptt(cls, steps, make_state, assert_rel_close):
    cell = cls(3, 5)
    x = torch.randn(2, steps, 3)
    h0 = make_state(cell, 2, F32)
    stats_seen = []

    def run(c, a, b):
        states, stats = pc.newton_apply(c, a, b, config=FUSED)
        stats_seen.append(stats)
        return states

    _check_fused_layer(cell, x, h0, run, assert_rel_close, f"{cls.__name__} fused T={steps}")
    stats = stats_seen[0]
    assert stats.backend == "fused" and stats.converged
    assert stats.max_residual <= 1e-6 and len(stats.residuals) == stats.iters + 1


@needs_interpreter
@pytest.mark.parametrize("cls", [pc.ParaLSTM, pc.ParaSLSTM])
def test_fused_newton_from_the_empty_state(cls, assert_rel_close):
    # h0=None: the cell's empty state (for the sLSTM ℓ = EMPTY_LOG_NORMALISER, not zeros).
    cell = cls(3, 5)
    x = torch.randn(2, 40, 3)

    def run(c, a, b):
        return pc.newton_apply(c, a, b, config=FUSED)[0]

    _check_fused_layer(cell, x, None, run, assert_rel_close, f"{cls.__name__} empty h0")


@needs_interpreter
@pytest.mark.parametrize("cls", CELLS)
def test_fused_sequential_apply_equals_sequential_and_bptt(cls, make_state, assert_rel_close):
    cell = cls(3, 5)
    x = torch.randn(2, 17, 3)
    h0 = make_state(cell, 2, F32)
    label = f"{cls.__name__} fused seq"
    _check_fused_layer(cell, x, h0, pc.fused_sequential_apply, assert_rel_close, label)


@needs_interpreter
@pytest.mark.parametrize("cls", CELLS)
def test_fused_nan_is_never_silent(cls):
    cell = cls(3, 4)
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


@needs_interpreter
def test_fused_sequential_apply_checks_its_states_when_asked():
    """stats="sync" raises from the forward, "deferred" from the backward before any gradient
    is handed on, "device" (the default) never looks; a bad mode names the argument."""
    cell = pc.ParaGRU(3, 4)
    x = torch.randn(2, 10, 3)
    x[1, 4, 0] = float("nan")
    states = pc.fused_sequential_apply(cell, x)
    assert states[1, 4:].isnan().all() and states[0].isfinite().all()
    with pytest.raises(pc.NewtonDivergenceError, match="fused sequential recurrence"):
        pc.fused_sequential_apply(cell, x, stats="sync")
    leaf = x.clone().requires_grad_()
    states = pc.fused_sequential_apply(cell, leaf, stats="deferred")
    with pytest.raises(pc.NewtonDivergenceError, match="fused sequential recurrence"):
        states.sum().backward()
    assert leaf.grad is None and all(p.grad is None for p in cell.parameters())
    with pytest.raises(ValueError, match="stats must be 'sync', 'deferred' or 'device', got 'on'"):
        pc.fused_sequential_apply(cell, x, stats="on")  # type: ignore[arg-type]


class _SubclassedGRU(pc.ParaGRU):
    """A subclass may change the step, so it does not inherit the fused kernels."""


def test_fused_refuses_cells_without_kernels_and_says_what_to_use():
    for cls in CELLS:
        assert pc.has_fused_kernels(cls(3, 4))
    assert not pc.has_fused_kernels(_SubclassedGRU(3, 4))
    served = r"ParaGRU, ParaLSTM and ParaSLSTM\(mix='diag'\)"
    with pytest.raises(
        ValueError, match=served + "; got a _SubclassedGRU: use scan_backend='auto'"
    ):
        pc.newton_apply(_SubclassedGRU(3, 4), torch.randn(2, 8, 3), config=FUSED)
    with pytest.raises(ValueError, match=served + "; got a _SubclassedGRU: use sequential_apply"):
        pc.fused_sequential_apply(_SubclassedGRU(3, 4), torch.randn(2, 8, 3))


def test_kernels_and_cell_agree_on_the_empty_log_normaliser():
    assert SLSTM_EMPTY_LOG_NORMALISER == EMPTY_LOG_NORMALISER


def test_fused_refuses_float64_naming_the_dtype():
    cell = pc.ParaLSTM(3, 4, dtype=F64)
    with pytest.raises(ValueError, match=r"got u of torch\.float64"):
        pc.newton_apply(cell, torch.randn(2, 8, 3, dtype=F64), config=FUSED)


@pytest.mark.parametrize("cls", CELLS)
def test_auto_on_cpu_keeps_the_unfused_path(cls):
    _states, stats = pc.newton_apply(cls(3, 4), torch.randn(2, 8, 3))
    assert stats.backend in ("eager", "triton")


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("cls", CELLS)
@pytest.mark.parametrize("steps", [17, 4096])
@pytest.mark.parametrize("backend", ["fused", "auto"])
def test_fused_on_gpu(cls, backend, steps, make_state, assert_rel_close):
    cell = cls(256, 256, device="cuda")
    x = torch.randn(8, steps, 256, device="cuda")
    h0 = make_state(cell, 8, F32).cuda()
    seen = []

    def run(c, a, b):
        states, stats = pc.newton_apply(c, a, b, config=pc.NewtonConfig(scan_backend=backend))
        seen.append(stats)
        return states

    label = f"cuda {cls.__name__} {backend} T={steps}"
    _check_fused_layer(cell, x, h0, run, assert_rel_close, label)
    if backend == "fused":
        assert seen[0].backend == "fused"
    else:
        assert cls in pc.fused.AUTO_FUSED_CELLS
        assert seen[0].backend in ("fused", "fused_sequential")


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("cls", CELLS)
def test_eval_mode_uses_the_fused_sequential_kernel(cls, assert_rel_close):
    model = pc.ParaRNN(cls(64, 128)).cuda()
    x = torch.randn(4, 300, 64, device="cuda")
    model.eval()
    cell = model.cells[0]
    with torch.no_grad():
        y = model(x)
        reference = cell.output(pc.sequential_apply(copy.deepcopy(cell).double(), x.double()))
    assert_rel_close(y, reference, rel=1e-5, what="eval (fused sequential) vs float64 sequential")


@needs_interpreter
def test_fused_fallback_measures_the_residual_it_returns(assert_rel_close):
    """A threshold below any residual forces the fallback; its stats carry the measured residual."""
    cell = pc.ParaGRU(3, 5)
    x = torch.randn(2, 17, 3)
    config = pc.NewtonConfig(
        scan_backend="fused", divergence_threshold=1e-30, on_divergence="sequential"
    )
    states, stats = pc.newton_apply(cell, x, config=config)
    assert stats.fallback == "sequential" and not stats.converged
    assert 0.0 <= stats.max_residual <= 1e-6
    with torch.no_grad():
        reference = pc.sequential_apply(copy.deepcopy(cell).double(), x.double())
    assert_rel_close(states.detach(), reference, rel=1e-5, what="fused fallback states")
