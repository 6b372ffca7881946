"""``NewtonConfig(stats="deferred")``: the forward waits for nothing, the stats arrive later.

The same solve with ``stats="sync"`` and ``"deferred"`` gives bit-identical states and gradients
and equal stats; a divergence raises when the deferred stats are first read or in the layer's
backward (after the backward has queued its work, before any gradient leaves it), not in the
forward. Unfused paths run everywhere (eager scans on the CPU), the
fused kernels in the Triton interpreter on the CPU (``TRITON_INTERPRET=1``) and compiled on the
GPU, where a deferred forward must not synchronize the device at all.
"""

from __future__ import annotations

import dataclasses
import math
import pickle
from collections.abc import Callable
from typing import Any

import pytest
import torch

import pararnn_core as pc
import pararnn_core.fused as core_fused
from pararnn_core.fused import fused_newton_apply
from pararnn_kernels.dispatch import triton_interpret_mode
from pararnn_kernels.fused import summarize_fused_stats

CELLS = [pc.ParaGRU, pc.ParaLSTM, pc.ParaSLSTM]
needs_interpreter = pytest.mark.skipif(
    not triton_interpret_mode(), reason="the fused kernels on CPU need TRITON_INTERPRET=1"
)
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _run(cell: pc.ParaCell, x: torch.Tensor, config: pc.NewtonConfig):
    """States, stats and the gradients of x and every parameter of a weighted sum."""
    x = x.detach().clone().requires_grad_()
    states, stats = pc.newton_apply(cell, x, config=config)
    weight = torch.linspace(-1.0, 1.0, states.numel(), device=x.device).reshape(states.shape)
    grads = torch.autograd.grad((states * weight).sum(), [x, *cell.parameters()])
    return states.detach(), stats, grads


def _same_solve(cell: pc.ParaCell, x: torch.Tensor, **settings: object) -> pc.NewtonStats:
    sync = pc.NewtonConfig(**settings)  # type: ignore[arg-type]
    deferred = dataclasses.replace(sync, stats="deferred")
    states, stats, grads = _run(cell, x, sync)
    d_states, d_stats, d_grads = _run(cell, x, deferred)
    assert isinstance(d_stats, pc.DeferredNewtonStats)
    assert not isinstance(stats, pc.DeferredNewtonStats)
    assert torch.equal(d_states, states)
    for got, want in zip(d_grads, grads, strict=True):
        assert torch.equal(got, want)
    # Every field, equality both ways, the printed form, and a pickled copy.
    for field in dataclasses.fields(pc.NewtonStats):
        assert getattr(d_stats, field.name) == getattr(stats, field.name), field.name
    assert d_stats == stats and stats == d_stats and hash(d_stats) == hash(stats)
    assert repr(d_stats) == repr(stats)
    copied = pickle.loads(pickle.dumps(d_stats))
    assert type(copied) is pc.NewtonStats and copied == stats
    assert d_stats.resolved() == stats
    return stats


def test_config_checks_stats() -> None:
    assert pc.NewtonConfig().stats == "sync"
    with pytest.raises(ValueError, match="stats must be 'sync' or 'deferred', got 'later'"):
        pc.NewtonConfig(stats="later")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="stats='deferred' needs on_divergence='raise'"):
        pc.NewtonConfig(stats="deferred", on_divergence="sequential")


@pytest.mark.parametrize("cls", CELLS)
@pytest.mark.parametrize("steps", [1, 17])
def test_unfused_deferred_equals_sync(cls: type[pc.ParaCell], steps: int) -> None:
    torch.manual_seed(0)
    cell = cls(3, 5)
    x = torch.randn(2, steps, 3)
    stats = _same_solve(cell, x, scan_backend="eager")
    assert stats.iters == 3 and len(stats.residuals) == 4
    # With tol the loop reads each residual anyway; the stats still arrive the same way.
    _same_solve(cell, x, scan_backend="eager", tol=1e-6, max_iters=8)


def _diverging(config: pc.NewtonConfig) -> pc.NewtonConfig:
    # Any positive residual is past a threshold this small.
    return dataclasses.replace(config, divergence_threshold=1e-300)


def _check_deferred_divergence(cell: pc.ParaCell, x: torch.Tensor, config: pc.NewtonConfig):
    with pytest.raises(pc.NewtonDivergenceError):
        pc.newton_apply(cell, x, config=_diverging(config))
    x = x.detach().clone().requires_grad_()
    deferred = _diverging(dataclasses.replace(config, stats="deferred"))
    states, stats = pc.newton_apply(cell, x, config=deferred)  # returns: nothing was read yet
    with pytest.raises(pc.NewtonDivergenceError, match="Newton diverged"):
        states.sum().backward()
    assert x.grad is None
    for _ in range(2):  # every read raises, not only the first
        with pytest.raises(pc.NewtonDivergenceError):
            _ = stats.iters
    with pytest.raises(pc.NewtonDivergenceError):
        repr(stats)


@pytest.mark.parametrize("cls", CELLS)
def test_unfused_deferred_divergence_raises_on_read_and_in_backward(cls: type[pc.ParaCell]) -> None:
    torch.manual_seed(1)
    _check_deferred_divergence(
        cls(3, 5), torch.randn(2, 17, 3), pc.NewtonConfig(scan_backend="eager")
    )


def _logged(order: list[str], name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        order.append(name)
        return fn(*args, **kwargs)

    return call


def _run_backward(
    monkeypatch: pytest.MonkeyPatch,
    order: list[str],
    cell: pc.ParaCell,
    backend: str,
    diverge: bool,
) -> None:
    """A deferred layer's forward and backward, each read of its stats logged in ``order``."""
    monkeypatch.setattr(
        pc.DeferredNewtonStats,
        "resolved",
        _logged(order, "stats", pc.DeferredNewtonStats.resolved),
    )
    config = pc.NewtonConfig(scan_backend=backend, stats="deferred")
    if diverge:
        config = _diverging(config)
    x = torch.randn(2, 17, 3, requires_grad=True)
    states, _stats = pc.newton_apply(cell, x, config=config)
    if diverge:
        with pytest.raises(pc.NewtonDivergenceError):
            states.sum().backward()
        assert x.grad is None
    else:
        states.sum().backward()
        assert x.grad is not None and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("diverge", [False, True])
def test_unfused_backward_queues_its_work_before_it_waits(
    monkeypatch: pytest.MonkeyPatch, diverge: bool
) -> None:
    torch.manual_seed(6)
    cell = pc.ParaGRU(3, 5)
    order: list[str] = []
    monkeypatch.setattr(cell, "vjp", _logged(order, "work", cell.vjp))
    _run_backward(monkeypatch, order, cell, "eager", diverge)
    assert order == ["work", "stats"]


@needs_interpreter
@pytest.mark.parametrize("diverge", [False, True])
def test_fused_backward_queues_its_work_before_it_waits(
    monkeypatch: pytest.MonkeyPatch, diverge: bool
) -> None:
    torch.manual_seed(7)
    order: list[str] = []
    kernels = core_fused._GRU_KERNELS
    logged = dataclasses.replace(kernels, backward=_logged(order, "work", kernels.backward))
    monkeypatch.setattr(core_fused, "_GRU_KERNELS", logged)
    _run_backward(monkeypatch, order, pc.ParaGRU(3, 5), "fused", diverge)
    assert order == ["work", "stats"]


def test_module_keeps_deferred_stats() -> None:
    torch.manual_seed(2)
    config = pc.NewtonConfig(scan_backend="eager", stats="deferred")
    model = pc.ParaRNN([pc.ParaGRU(4, 6), pc.ParaGRU(6, 6)], config=config).train()
    x = torch.randn(3, 17, 4)
    model(x).sum().backward()
    assert len(model.last_stats) == 2
    assert all(isinstance(s, pc.DeferredNewtonStats) and s.iters == 3 for s in model.last_stats)


def test_summarize_fused_stats() -> None:
    # H = 4: residuals before updates 0..2, the largest a chunk stopped at, the most updates.
    assert summarize_fused_stats([0.5, 0.01, 0.0, 1e-7, 2.0]) == (2, (0.5, 0.01, 0.0), 1e-7)
    assert summarize_fused_stats([0.5, 0.01, 0.0, 1e-7, 1.0], 1e-3)[2] == 1e-3
    assert summarize_fused_stats([math.inf, 0.0, 0.0, 0.0, 0.0])[2] == math.inf
    with pytest.raises(ValueError, match="got 1"):
        summarize_fused_stats([0.0])


@needs_interpreter
@pytest.mark.parametrize("cls", CELLS)
def test_fused_deferred_equals_sync(cls: type[pc.ParaCell]) -> None:
    torch.manual_seed(3)
    cell = cls(3, 5)
    x = torch.randn(2, 17, 3)
    stats = _same_solve(cell, x, scan_backend="fused")
    assert stats.backend == "fused"
    _check_deferred_divergence(cell, x, pc.NewtonConfig(scan_backend="fused"))


@needs_interpreter
def test_fused_sequential_deferred_non_finite_raises_on_read() -> None:
    torch.manual_seed(4)
    cell = pc.ParaGRU(3, 5)
    u = cell.project(torch.randn(2, 17, 3)).detach()
    h0 = torch.zeros(2, 5)
    deferred = pc.NewtonConfig(scan_backend="fused", stats="deferred")
    _, stats = fused_newton_apply(cell, u, h0, deferred, "fused_sequential")
    assert isinstance(stats, pc.DeferredNewtonStats)
    assert stats == pc.NewtonStats(0, 0.0, (0.0,), "fused_sequential", True)
    u_bad = u.clone()
    u_bad[1, 4, 0] = math.nan
    _, bad = fused_newton_apply(cell, u_bad, h0, deferred, "fused_sequential")
    with pytest.raises(pc.NewtonDivergenceError, match="non-finite states"):
        _ = bad.converged


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("cls", CELLS)
def test_fused_deferred_forward_never_syncs_on_gpu(cls: type[pc.ParaCell]) -> None:
    """With ``stats="deferred"`` the fused forward queues its copies and returns: under
    ``torch.cuda.set_sync_debug_mode("error")`` any synchronizing call would raise."""
    torch.manual_seed(5)
    dev = torch.device("cuda")
    cell = cls(64, 64).to(dev)
    x = torch.randn(4, 1024, 64, device=dev)
    _same_solve(cell, x, scan_backend="fused")
    deferred = pc.NewtonConfig(scan_backend="fused", stats="deferred")
    with torch.no_grad():
        pc.newton_apply(cell, x, config=deferred)  # compiled and warm
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            states, stats = pc.newton_apply(cell, x, config=deferred)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert stats.iters >= 1 and torch.isfinite(states).all()
