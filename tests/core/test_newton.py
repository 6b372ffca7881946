"""Newton against the sequential recurrence: states, gradients (eq. 2.6 vs BPTT), gradcheck,
stats, divergence, and the scan-backend registry."""

from __future__ import annotations

import math
import os
import sys
import textwrap

import pytest
import torch
from torch import Tensor, nn

import pararnn_core as pc

CELLS = [pc.ParaGRU, pc.ParaLSTM, pc.ParaSLSTM]
F64, F32 = torch.float64, torch.float32
TIGHT = pc.NewtonConfig(max_iters=12, tol=1e-12)
STEPS = [1, 17, 256, 4096]
# (B, d_in, d_h) per T: T = 4096 stays small so the CPU suite is quick.
SIZES = {1: (3, 4, 6), 17: (3, 4, 6), 256: (2, 4, 5), 4096: (2, 3, 5)}


def _problem(cls, steps: int, make_state) -> tuple[pc.ParaCell, Tensor, Tensor]:
    batch, d_in, d_h = SIZES[steps]
    cell = cls(d_in, d_h, dtype=F64)
    x = torch.randn(batch, steps, d_in, dtype=F64)
    return cell, x, make_state(cell, batch, F64)


@pytest.mark.parametrize("steps", STEPS)
@pytest.mark.parametrize("cls", CELLS)
def test_newton_equals_sequential_float64(cls, steps, make_state, assert_close):
    cell, x, h0 = _problem(cls, steps, make_state)
    with torch.no_grad():
        reference = pc.sequential_apply(cell, x, h0)
        states, stats = pc.newton_apply(cell, x, h0, config=TIGHT)
    print(
        f"{cls.__name__} T={steps} float64: {stats.iters} iterations, residuals {stats.residuals}"
    )
    assert stats.converged and stats.max_residual <= 1e-12
    assert_close(states, reference, atol=1e-9, what=f"{cls.__name__} T={steps} float64 states")


@pytest.mark.parametrize("steps", STEPS)
@pytest.mark.parametrize("cls", CELLS)
def test_newton_equals_sequential_float32_default_config(
    cls, steps, make_state, to_dtype, assert_close
):
    cell, x, h0 = _problem(cls, steps, make_state)
    cell32 = to_dtype(cell, F32)
    with torch.no_grad():
        reference = pc.sequential_apply(cell, x, h0)  # float64
        states, stats = pc.newton_apply(cell32, x.float(), h0.float())
    print(
        f"{cls.__name__} T={steps} float32: {stats.iters} iterations, residuals {stats.residuals}"
    )
    assert stats.iters == pc.NewtonConfig().max_iters == 3
    assert states.dtype == F32
    assert_close(states, reference, atol=1e-5, what=f"{cls.__name__} T={steps} float32 states")


def _grads(cell: pc.ParaCell, x: Tensor, h0: Tensor, weight: Tensor, solve) -> list[Tensor]:
    x_leaf, h0_leaf = x.clone().requires_grad_(), h0.clone().requires_grad_()
    states = solve(cell, x_leaf, h0_leaf)
    # A loss on the full state (c and ℓ components included) and on the output.
    loss = (states * weight).sum() + cell.output(states).square().sum()
    params = list(cell.parameters())
    return list(torch.autograd.grad(loss, [x_leaf, h0_leaf, *params]))


def _names(cell: pc.ParaCell) -> list[str]:
    return ["x", "h0", *(name for name, _ in cell.named_parameters())]


@pytest.mark.parametrize("steps", STEPS)
@pytest.mark.parametrize("cls", CELLS)
def test_gradients_equal_bptt(cls, steps, make_state, to_dtype, assert_rel_close):
    cell, x, h0 = _problem(cls, steps, make_state)
    weight = torch.randn(x.shape[0], steps, *cell.state_shape, dtype=F64)
    reference = _grads(cell, x, h0, weight, pc.sequential_apply)
    newton64 = _grads(
        cell, x, h0, weight, lambda c, a, b: pc.newton_apply(c, a, b, config=TIGHT)[0]
    )
    cell32 = to_dtype(cell, F32)
    newton32 = _grads(
        cell32, x.float(), h0.float(), weight.float(), lambda c, a, b: pc.newton_apply(c, a, b)[0]
    )
    for name, ref, g64, g32 in zip(_names(cell), reference, newton64, newton32, strict=True):
        assert g64.dtype == F64 and g32.dtype == F32
        assert_rel_close(g64, ref, rel=1e-8, what=f"{cls.__name__} T={steps} float64 grad {name}")
        assert_rel_close(g32, ref, rel=1e-5, what=f"{cls.__name__} T={steps} float32 grad {name}")


@pytest.mark.parametrize("cls", CELLS)
def test_gradcheck_float64(cls, make_state):
    cell = cls(2, 3, dtype=F64)
    x = torch.randn(2, 17, 2, dtype=F64, requires_grad=True)
    h0 = make_state(cell, 2, F64).requires_grad_()
    config = pc.NewtonConfig(max_iters=20, tol=1e-14)

    def run(x: Tensor, h0: Tensor, *params: Tensor) -> Tensor:
        # gradcheck perturbs the parameters in place, so the cell sees the perturbation.
        states, _ = pc.newton_apply(cell, x, h0, config=config)
        return states

    assert torch.autograd.gradcheck(run, (x, h0, *cell.parameters()), eps=1e-6, atol=1e-7)


def test_grads_reach_every_parameter_through_the_function():
    """Recurrent parameters get their gradient from the Newton Function (an explicit input)."""
    cell = pc.ParaGRU(3, 4, dtype=F64)
    states, _ = pc.newton_apply(cell, torch.randn(2, 9, 3, dtype=F64))
    node = states.grad_fn
    assert node is not None and "NewtonFunction" in type(node).__name__
    # Parameters are direct inputs of the Function node (as a Linear's weight is of addmm).
    leaves = {
        id(fn.variable) for fn, _ in node.next_functions if type(fn).__name__ == "AccumulateGrad"
    }
    assert id(cell.recurrent_weight) in leaves
    states.sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in cell.parameters())


def test_without_h0_no_h0_gradient_and_empty_state(assert_close):
    cell = pc.ParaSLSTM(3, 4, dtype=F64)
    x = torch.randn(2, 30, 3, dtype=F64)
    states, _ = pc.newton_apply(cell, x, config=TIGHT)
    explicit, _ = pc.newton_apply(cell, x, cell.initial_state(2, dtype=F64), config=TIGHT)
    assert_close(states, explicit, atol=0, what="h0=None is the empty state")


# ------------------------------------------------------------------------------------------------
# Stats
# ------------------------------------------------------------------------------------------------


def test_stats_contents():
    cell = pc.ParaLSTM(3, 4, dtype=F64)
    x = torch.randn(2, 100, 3, dtype=F64)
    with torch.no_grad():
        states, stats = pc.newton_apply(cell, x)
        residual = (
            cell.step(
                torch.cat([torch.zeros_like(states[:, :1]), states[:, :-1]], 1), cell.project(x)
            )
            - states
        )
    assert stats.iters == 3
    assert len(stats.residuals) == stats.iters + 1
    assert stats.max_residual == stats.residuals[-1]
    assert stats.max_residual == pytest.approx(residual.abs().max().item(), rel=1e-12, abs=1e-300)
    assert all(b < a for a, b in zip(stats.residuals, stats.residuals[1:], strict=False))
    assert stats.backend == "eager"  # "auto" on CPU
    assert stats.converged  # below sqrt(eps) of float64
    assert stats.fallback is None


def test_tol_stops_early_and_zero_tol_never_does():
    cell = pc.ParaGRU(3, 4, dtype=F64)
    x = torch.randn(2, 200, 3, dtype=F64)
    _, loose = pc.newton_apply(cell, x, config=pc.NewtonConfig(max_iters=10, tol=1e-3))
    assert loose.converged and loose.iters < 10 and loose.max_residual <= 1e-3
    assert loose.residuals[-2] > 1e-3  # it did not stop one iteration late
    _, never = pc.newton_apply(cell, x, config=pc.NewtonConfig(max_iters=4, tol=0.0))
    assert never.iters == 4 and len(never.residuals) == 5


def test_not_converged_is_reported_not_raised():
    cell = pc.ParaSLSTM(3, 4, dtype=F64)
    _, stats = pc.newton_apply(
        cell, 3 * torch.randn(2, 300, 3, dtype=F64), config=pc.NewtonConfig(max_iters=1, tol=1e-12)
    )
    assert stats.iters == 1 and not stats.converged and stats.max_residual > 1e-12


def test_omega_damps_the_update(assert_close):
    cell = pc.ParaGRU(3, 4, dtype=F64)
    x = torch.randn(2, 50, 3, dtype=F64)
    _, plain = pc.newton_apply(cell, x, config=pc.NewtonConfig(max_iters=2))
    damped_states, damped = pc.newton_apply(
        cell, x, config=pc.NewtonConfig(max_iters=30, omega=0.5)
    )
    assert damped.residuals[1] > plain.residuals[1]  # half steps converge more slowly ...
    assert_close(
        damped_states, pc.sequential_apply(cell, x), atol=1e-7, what="damped"
    )  # ... but do


def test_initial_guess_options(assert_close):
    cell = pc.ParaLSTM(3, 4, dtype=F64)
    x = torch.randn(2, 40, 3, dtype=F64)
    config = pc.NewtonConfig(max_iters=1, initial_guess="initial_state")
    _, stats = pc.newton_apply(cell, x, config=config)
    with torch.no_grad():
        first = cell.step(torch.zeros(2, 40, 4, 2, dtype=F64), cell.project(x))
    # From H = 0 the first residual is f(0, u) itself (at t > 0; at t = 0 h0 = 0 too).
    assert stats.residuals[0] == pytest.approx(first.abs().max().item(), rel=1e-12)


def _uncoupled_cell(cell: pc.ParaCell, to_dtype) -> pc.ParaCell:
    """A copy of ``cell`` without the couplings ``uncoupled_states`` drops: the recurrent weights
    (and ParaLSTM's forget peephole ``p_f``; its output peephole stays)."""
    copy = to_dtype(cell, F64)
    with torch.no_grad():
        copy.recurrent_weight.zero_()
        if isinstance(copy, pc.ParaLSTM):
            copy.peephole_weight[0].zero_()
    return copy


@pytest.mark.parametrize("steps", [1, 17, 63])
@pytest.mark.parametrize("cls", CELLS)
@pytest.mark.parametrize("start", ["random", "empty"])
def test_uncoupled_states_solve_the_uncoupled_cell(
    cls, steps, start, make_state, to_dtype, assert_close
):
    # D = 6 (not a power of two); the empty start puts the sLSTM's ℓ at -1e4.
    cell = cls(4, 6, dtype=F64)
    x = torch.randn(3, steps, 4, dtype=F64)
    h0 = make_state(cell, 3, F64) if start == "random" else cell.initial_state(3, dtype=F64)
    with torch.no_grad():
        u = cell.project(x)
        reference = pc.sequential_apply(_uncoupled_cell(cell, to_dtype), x, h0)
        for dtype, atol in ((F64, 1e-12), (F32, 2e-6)):
            guess = to_dtype(cell, dtype).uncoupled_states(u.to(dtype), h0.to(dtype))
            assert guess.dtype == dtype
            assert_close(guess, reference, atol=atol, what=f"{cls.__name__} T={steps} {dtype}")


@pytest.mark.parametrize("cls", CELLS)
def test_uncoupled_guess_saves_newton_updates(cls, make_state, assert_close):
    # At the init's weights the guess already holds the memory of the gates of the inputs: its
    # first residual is smaller, and after two updates its residual is below a hundredth of
    # one step's guess's (measured: 4e-9 / 2e-5 GRU, 3e-7 / 3e-4 sLSTM), about one update ahead.
    cell = cls(4, 6, dtype=F64)
    x = torch.randn(2, 256, 4, dtype=F64)
    h0 = make_state(cell, 2, F64)
    stats = {}
    with torch.no_grad():
        reference = pc.sequential_apply(cell, x, h0)
        for guess in ("step", "uncoupled"):
            config = pc.NewtonConfig(max_iters=12, tol=1e-12, initial_guess=guess)
            states, stats[guess] = pc.newton_apply(cell, x, h0, config=config)
            assert_close(states, reference, atol=1e-10, what=f"{cls.__name__} {guess}")
    print({k: v.residuals[:3] for k, v in stats.items()})
    assert stats["uncoupled"].residuals[0] < stats["step"].residuals[0]
    assert stats["uncoupled"].residuals[2] < 1e-2 * stats["step"].residuals[2]


def test_uncoupled_guess_needs_a_cell_that_defines_it():
    cell = LogisticCell(3, dtype=F64)
    config = pc.NewtonConfig(initial_guess="uncoupled")
    with pytest.raises(ValueError, match="LogisticCell does not"):
        pc.newton_apply(cell, torch.rand(2, 5, 3, dtype=F64), config=config)

    class WrongShape(LogisticCell):
        def uncoupled_states(self, u: Tensor, h0: Tensor) -> Tensor:
            return u[:, :-1]

    with pytest.raises(ValueError, match=r"returned shape \(2, 4, 3\), expected \(2, 5, 3\)"):
        pc.newton_apply(WrongShape(3, dtype=F64), torch.rand(2, 5, 3, dtype=F64), config=config)


# ------------------------------------------------------------------------------------------------
# Divergence
# ------------------------------------------------------------------------------------------------


class LogisticCell(pc.ParaCell):
    """A deliberately unstable cell: the chaotic logistic map, ``h' = 3.9 h (1 - h) + u``."""

    def __init__(self, d: int, dtype: torch.dtype | None = None) -> None:
        super().__init__(d_in=d, d_h=d, d_u=d, structure=pc.Diag())
        self.rate = nn.Parameter(torch.full((d,), 3.9, dtype=dtype))

    def project(self, x: Tensor) -> Tensor:
        return 0.01 * torch.sigmoid(x)

    def step(self, h_prev: Tensor, u: Tensor) -> Tensor:
        return self.rate * h_prev * (1 - h_prev) + u


@pytest.mark.parametrize("dtype", [F64, F32])
def test_divergence_raises_with_history(dtype):
    cell = LogisticCell(3, dtype)
    x = torch.randn(2, 256, 3, dtype=dtype)
    with pytest.raises(pc.NewtonDivergenceError, match=r"residual per iteration \[") as info:
        pc.newton_apply(cell, x)
    history = info.value.residuals
    assert len(history) == 4 and not all(math.isfinite(r) for r in history)
    assert "LogisticCell" in str(info.value)


def test_divergence_past_threshold_while_finite():
    cell = LogisticCell(3, F64)
    x = torch.randn(2, 48, 3, dtype=F64)  # short enough for finite float64 iterates
    config = pc.NewtonConfig(max_iters=8, tol=1e-12, divergence_threshold=10.0)
    with pytest.raises(pc.NewtonDivergenceError) as info:
        pc.newton_apply(cell, x, config=config)
    history = info.value.residuals
    assert all(math.isfinite(r) for r in history)
    assert history[-1] > 10.0 and all(r <= 10.0 for r in history[:-1])  # stopped right there
    assert info.value.threshold == 10.0


def test_sequential_fallback_is_exact_and_differentiable(assert_close, assert_rel_close):
    cell = LogisticCell(3, F64)
    x = torch.randn(2, 40, 3, dtype=F64, requires_grad=True)
    config = pc.NewtonConfig(on_divergence="sequential")
    states, stats = pc.newton_apply(cell, x, config=config)
    assert stats.fallback == "sequential" and not stats.converged
    assert stats.max_residual == 0.0
    assert not all(r < config.divergence_threshold for r in stats.residuals)
    reference = pc.sequential_apply(cell, x)
    assert_close(states, reference, atol=0, what="fallback states")
    weight = torch.randn_like(states)
    (g_newton,) = torch.autograd.grad((states * weight).sum(), x)
    (g_bptt,) = torch.autograd.grad((reference * weight).sum(), x)
    assert_rel_close(g_newton, g_bptt, rel=1e-8, what="fallback grad x")


def test_nan_input_is_never_silent():
    cell = pc.ParaGRU(3, 4)
    x = torch.randn(2, 10, 3)
    x[1, 4, 0] = float("nan")
    with pytest.raises(pc.NewtonDivergenceError, match="nan"):
        pc.newton_apply(cell, x)
    with pytest.raises(pc.NewtonDivergenceError, match="not finite either"):
        pc.newton_apply(cell, x, config=pc.NewtonConfig(on_divergence="sequential"))


# ------------------------------------------------------------------------------------------------
# Scan backends
# ------------------------------------------------------------------------------------------------


class CountingScan:
    def __init__(self) -> None:
        self.calls: list[bool] = []
        self.inner = pc.KernelScan("eager")

    def __call__(self, jac, rhs, h0, *, reverse, structure):
        self.calls.append(reverse)
        return self.inner(jac, rhs, h0, reverse=reverse, structure=structure)


@pytest.fixture
def counting_backend():
    backend = CountingScan()
    pc.register_scan_backend("counting", backend)
    yield backend
    pc.unregister_scan_backend("counting")


def test_registered_backend_runs_forward_and_backward(counting_backend, assert_close):
    cell = pc.ParaLSTM(3, 4, dtype=F64)
    x = torch.randn(2, 20, 3, dtype=F64, requires_grad=True)
    states, stats = pc.newton_apply(cell, x, config=pc.NewtonConfig(scan_backend="counting"))
    assert stats.backend == "counting"
    assert counting_backend.calls == [False, False, False]
    states.sum().backward()
    assert counting_backend.calls[-1] is True and len(counting_backend.calls) == 4
    assert "counting" in pc.known_scan_backends()
    with pytest.raises(ValueError, match="already registered"):
        pc.register_scan_backend("counting", counting_backend)


def test_entry_point_backend_is_loaded_lazily(tmp_path, monkeypatch):
    module = tmp_path / "my_scan_plugin.py"
    module.write_text(
        textwrap.dedent(
            """
            import pararnn_core as pc
            LOADED = []
            _inner = pc.KernelScan("eager")
            def scan(jac, rhs, h0, *, reverse, structure):
                LOADED.append(reverse)
                return _inner(jac, rhs, h0, reverse=reverse, structure=structure)
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    from importlib.metadata import EntryPoint

    fake = [EntryPoint(name="plugin_scan", value="my_scan_plugin:scan", group=pc.ENTRY_POINT_GROUP)]

    def entry_points(*, group: str):
        return fake if group == pc.ENTRY_POINT_GROUP else []

    monkeypatch.setattr("pararnn_core.backends.importlib.metadata.entry_points", entry_points)
    try:
        config = pc.NewtonConfig(scan_backend="plugin_scan")  # validated without importing
        assert "my_scan_plugin" not in sys.modules
        assert "plugin_scan" in pc.known_scan_backends()
        _, stats = pc.newton_apply(pc.ParaGRU(3, 4), torch.randn(2, 8, 3), config=config)
        assert stats.backend == "plugin_scan"
        assert sys.modules["my_scan_plugin"].LOADED == [False] * 3
    finally:
        pc.backends._REGISTRY.pop("plugin_scan", None)
        sys.modules.pop("my_scan_plugin", None)


def test_unknown_backend_lists_known_ones(monkeypatch):
    with pytest.raises(ValueError, match=r"one of 'auto', 'triton', 'eager', 'fused'.*got 'nope'"):
        pc.NewtonConfig(scan_backend="nope")
    # pararnn-core alone (no pararnn-dist entry point installed) names the package to install.
    monkeypatch.setattr(
        "pararnn_core.backends.importlib.metadata.entry_points", lambda *, group: []
    )
    with pytest.raises(ValueError, match="pip install pararnn-dist"):
        pc.NewtonConfig(scan_backend="context_parallel")
    with pytest.raises(TypeError, match="scan_backend must be a str"):
        pc.NewtonConfig(scan_backend=3)  # type: ignore[arg-type]


def test_fused_is_not_a_per_scan_backend():
    with pytest.raises(ValueError, match="whole-layer kernels"):
        pc.get_scan_backend("fused")


def test_triton_on_cpu_without_interpreter_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    config = pc.NewtonConfig(scan_backend="triton")
    with pytest.raises(ValueError, match="backend='triton' needs CUDA tensors"):
        pc.newton_apply(pc.ParaGRU(3, 4), torch.randn(2, 8, 3), config=config)


@pytest.mark.skipif(
    torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") != "1",
    reason="runs the Triton kernels in the CPU interpreter (tests/conftest.py sets it up)",
)
@pytest.mark.parametrize("cls", CELLS)
def test_triton_backend_in_interpreter_matches_eager(cls, assert_close, assert_rel_close):
    cell = cls(3, 4)
    x = torch.randn(2, 17, 3, requires_grad=True)
    results = {}
    for backend in ("triton", "eager"):
        states, stats = pc.newton_apply(cell, x, config=pc.NewtonConfig(scan_backend=backend))
        assert stats.backend == backend
        (grad,) = torch.autograd.grad(states.square().sum(), x)
        results[backend] = (states, grad)
    assert_close(results["triton"][0], results["eager"][0], atol=1e-6, what="states")
    assert_rel_close(results["triton"][1], results["eager"][1], rel=1e-5, what="grad x")


def test_bad_config_values():
    for kwargs, match in [
        ({"max_iters": 0}, "max_iters must be >= 1"),
        ({"tol": -1.0}, "tol must be None"),
        ({"omega": 0.0}, "omega must be"),
        ({"initial_guess": "random"}, "initial_guess"),
        ({"divergence_threshold": 0.0}, "divergence_threshold"),
        ({"on_divergence": "ignore"}, "on_divergence"),
    ]:
        with pytest.raises(ValueError, match=match):
            pc.NewtonConfig(**kwargs)
    with pytest.raises(TypeError, match="max_iters must be an int"):
        pc.NewtonConfig(max_iters=2.0)  # type: ignore[arg-type]
