"""``NewtonConfig(stats="deferred")`` and ``"device"``: the forward waits for nothing, the stats
arrive later.

The same solve with ``stats="sync"``, ``"deferred"`` and ``"device"`` gives bit-identical states
and gradients and equal stats; a divergence raises when the deferred stats are first read or in
the layer's backward (after the backward has queued its work, before any gradient leaves it),
not in the forward; device stats raise from every read and never in the backward. Unfused paths
run everywhere (eager scans on the CPU), the fused kernels in the Triton interpreter on the CPU
(``TRITON_INTERPRET=1``) and compiled on the GPU, where a deferred forward must not synchronize
the device at all and a ``"device"`` layer's forward and backward are captured in a CUDA graph
whose replays equal eager calls.
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
from pararnn_kernels.fused import (
    plan_fused_gru,
    plan_fused_lstm,
    plan_fused_slstm,
    summarize_fused_stats,
)

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
    states, stats, grads = _run(cell, x, sync)
    assert not isinstance(stats, pc.DeferredNewtonStats)
    for mode in ("deferred", "device"):
        d_states, d_stats, d_grads = _run(cell, x, dataclasses.replace(sync, stats=mode))
        assert isinstance(d_stats, pc.DeferredNewtonStats)
        assert d_stats.live == (mode == "device")
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
    with pytest.raises(
        ValueError, match="stats must be 'sync', 'deferred' or 'device', got 'later'"
    ):
        pc.NewtonConfig(stats="later")  # type: ignore[arg-type]
    for mode in ("deferred", "device"):
        with pytest.raises(ValueError, match=f"stats='{mode}' needs on_divergence='raise'"):
            pc.NewtonConfig(stats=mode, on_divergence="sequential")  # type: ignore[arg-type]


@pytest.mark.parametrize("live", [False, True])
def test_live_stats_read_anew_at_every_read(live: bool) -> None:
    """Deferred stats take their values in once; live (``"device"``) stats at every read, so
    stats captured in a CUDA graph follow its replays."""
    values = [pc.NewtonStats(1, 0.5, (1.0, 0.5), "fused", False)]
    calls: list[int] = []

    def resolve() -> pc.NewtonStats:
        calls.append(1)
        return values[0]

    stats = pc.DeferredNewtonStats(resolve, live=live)
    assert stats.iters == 1 and stats.max_residual == 0.5
    values[0] = pc.NewtonStats(2, 0.25, (1.0, 0.5, 0.25), "fused", True)
    assert stats.iters == (2 if live else 1) and stats.converged == live
    assert len(calls) == (4 if live else 1)  # four attribute reads


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
    for mode in ("deferred", "device"):
        x = x.detach().clone().requires_grad_()
        later = _diverging(dataclasses.replace(config, stats=mode))
        states, stats = pc.newton_apply(cell, x, config=later)  # returns: nothing was read yet
        if mode == "deferred":
            with pytest.raises(pc.NewtonDivergenceError, match="Newton diverged"):
                states.sum().backward()
            assert x.grad is None
        else:  # the backward does not look: the gradients arrive, the stats' reads raise
            states.sum().backward()
            assert x.grad is not None
        for _ in range(2):  # every read raises, not only the first
            with pytest.raises(pc.NewtonDivergenceError, match="Newton diverged"):
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
@pytest.mark.parametrize("shape", [(8, 1024, 256), (1, 16384, 256)], ids=["whole", "segments"])
def test_fused_deferred_forward_never_syncs_on_gpu(
    cls: type[pc.ParaCell], shape: tuple[int, int, int]
) -> None:
    """With ``stats="deferred"`` the fused forward queues its copies and returns: under
    ``torch.cuda.set_sync_debug_mode("error")`` any synchronizing call would raise. B·d = 2048
    channels fill the GPU in one time segment; with 256 the solve is split into time segments,
    which are chained on the device (nothing read back)."""
    torch.manual_seed(5)
    dev = torch.device("cuda")
    cell = cls(256, 256).to(dev)
    x = torch.randn(*shape, device=dev)
    if shape[0] == 1:  # the case is there for the split: it must still happen
        planner = {pc.ParaGRU: plan_fused_gru, pc.ParaLSTM: plan_fused_lstm}
        plan = planner.get(cls, plan_fused_slstm)(*shape, dev)
        assert plan.segments > 1, plan
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


@pytest.mark.parametrize(
    ("settings", "unfused", "message"),
    [
        ({"stats": "sync"}, False, r"needs NewtonConfig\(stats='device'\): stats='sync'"),
        ({"stats": "deferred"}, True, r"needs NewtonConfig\(stats='device'\): stats='deferred'"),
        ({"stats": "device", "tol": 1e-6}, True, r"needs NewtonConfig\(tol=None\)"),
    ],
)
def test_capture_refuses_a_solve_that_waits(
    monkeypatch: pytest.MonkeyPatch, settings: dict[str, Any], unfused: bool, message: str
) -> None:
    """While a CUDA graph is captured (stood in for on the CPU), a solve that would wait for
    the device raises a clear RuntimeError before it starts; ``"device"`` runs."""
    import pararnn_core._outcome as outcome

    monkeypatch.setattr(outcome, "capturing", lambda device: True)
    torch.manual_seed(8)
    cell, x = pc.ParaGRU(3, 5), torch.randn(2, 17, 3)
    config = pc.NewtonConfig(scan_backend="eager", **settings)
    with pytest.raises(RuntimeError, match=message):
        outcome.refuse_while_capturing(config, x, unfused=unfused)
    with pytest.raises(RuntimeError, match=message):
        pc.newton_apply(cell, x, config=config)
    states, stats = pc.newton_apply(
        cell, x, config=pc.NewtonConfig(scan_backend="eager", stats="device")
    )
    assert stats.live and stats.iters == 3 and torch.isfinite(states).all()
    # The fused path's tol is decided on the device: it captures.
    outcome.refuse_while_capturing(
        pc.NewtonConfig(scan_backend="fused", stats="device", tol=1e-6), x, unfused=False
    )
