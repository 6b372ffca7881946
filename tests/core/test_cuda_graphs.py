"""A training step's layers captured in a CUDA graph (``NewtonConfig(stats="device")``).

Each cell's fused layer, and the unfused Triton path, is captured forward and backward in one
``torch.cuda.graph`` after a warm-up on a side stream; replays on new inputs copied into the
static input must equal eager calls on the same inputs (float32, 1e-5 relative to each tensor's
largest value: converged solves of the same inputs, with as many iterations as convergence
takes), also after the parameters were changed in place as an optimizer does, and the stats
taken at capture follow the replays (checked against the captured states' float64 residual).
A layer the fused kernels split into time segments is captured split too (the segments are
chained on the device) and checked against the float64 sequential recurrence as well. GPU only.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch

import pararnn_core as pc
from pararnn_kernels.fused import plan_fused_gru

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

CELLS = [pc.ParaGRU, pc.ParaLSTM, pc.ParaSLSTM]


def _step(
    cell: pc.ParaCell, x: torch.Tensor, weight: torch.Tensor, config: pc.NewtonConfig
) -> tuple[torch.Tensor, list[torch.Tensor], pc.NewtonStats]:
    """A layer's forward and backward: states, the gradients of x and every parameter, stats."""
    for p in cell.parameters():
        p.grad = None
    x.grad = None
    states, stats = pc.newton_apply(cell, x, config=config)
    (states * weight).sum().backward()
    assert x.grad is not None
    grads = [x.grad, *(p.grad for p in cell.parameters() if p.grad is not None)]
    return states, grads, stats


def _captured(fn: Callable[[], object]) -> torch.cuda.CUDAGraph:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def _close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    scale = max(1.0, float(want.abs().max()))
    err = float((got.double() - want.double()).abs().max())
    assert err <= 1e-5 * scale, f"{what}: max error {err:.3e} > {1e-5 * scale:.3e}"


def _residual64(cell: pc.ParaCell, x: torch.Tensor, states: torch.Tensor) -> float:
    """``max |f(h_{t-1}, u_t) - h_t|`` of ``states`` in float64 (zero initial state)."""
    cell64 = copy.deepcopy(cell).double()
    with torch.no_grad():
        h = states.detach().double()
        h0 = cell64.initial_state(h.shape[0], device=h.device, dtype=torch.float64)
        h_prev = torch.cat([h0.unsqueeze(1), h[:, :-1]], dim=1)
        return float((cell64.step(h_prev, cell64.project(x.double())) - h).abs().max())


@pytest.mark.parametrize(
    ("cls", "backend", "shape"),
    [
        *((cls, "fused", (4, 1000, 48)) for cls in CELLS),
        (pc.ParaGRU, "triton", (4, 63, 48)),
        (pc.ParaGRU, "fused", (1, 32768, 40)),  # split into time segments
    ],
)
def test_layer_captures_and_replays_like_eager_calls(
    cls: type[pc.ParaCell], backend: str, shape: tuple[int, int, int]
) -> None:
    torch.manual_seed(0)
    dev = torch.device("cuda")
    batch, steps, width = shape
    cell = cls(width, width).to(dev)
    # Iterations enough to converge (the fused kernels stop each tile at their 1e-6 tolerance).
    config = pc.NewtonConfig(scan_backend=backend, stats="device", max_iters=12)
    static_x = torch.randn(batch, steps, width, device=dev, requires_grad=True)
    weight = torch.randn(batch, steps, *cell.state_shape, device=dev)
    out: list[tuple[torch.Tensor, list[torch.Tensor], pc.NewtonStats]] = []

    def step() -> None:
        out[:] = [_step(cell, static_x, weight, config)]

    if batch == 1:  # the case is there for the split: it must still happen
        assert plan_fused_gru(batch, steps, width, dev).segments > 1
    graph = _captured(step)
    captured_states, captured_grads, captured_stats = out[0]
    assert isinstance(captured_stats, pc.DeferredNewtonStats) and captured_stats.live
    eager_cell = copy.deepcopy(cell)
    first_residuals: list[float] = []
    for trial in range(2):
        x = torch.randn(batch, steps, width, device=dev) * (1.0 + trial)
        with torch.no_grad():
            static_x.copy_(x)
            if trial:  # an optimizer's in-place update: the replay must read the new values
                for p, q in zip(cell.parameters(), eager_cell.parameters(), strict=True):
                    p.mul_(0.9)
                    q.mul_(0.9)
        graph.replay()
        torch.cuda.synchronize()
        states, grads, stats = _step(eager_cell, x.clone().requires_grad_(), weight, config)
        if batch == 1:  # in segments: both against the float64 recurrence too
            ref = pc.sequential_apply(copy.deepcopy(cell).double(), x.double())
            _close(states, ref, "eager states")
            _close(captured_states, ref, "captured states")
        _close(captured_states, states, f"states, replay {trial}")
        for i, (got, want) in enumerate(zip(captured_grads, grads, strict=True)):
            _close(got, want, f"gradient {i}, replay {trial}")
        # The stats follow the replay: checked against the captured states themselves.
        assert captured_stats.converged and stats.converged, (captured_stats, stats)
        first_residuals.append(captured_stats.residuals[0])
        true_residual = _residual64(cell, x, captured_states)
        assert abs(captured_stats.max_residual - true_residual) <= 1e-5, (
            f"captured max_residual {captured_stats.max_residual:.3e}, "
            f"float64 residual of the captured states {true_residual:.3e}, replay {trial}"
        )
    if first_residuals:  # the second replay's inputs are twice as large
        assert first_residuals[0] != first_residuals[1], first_residuals


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"scan_backend": "fused"}, r"needs NewtonConfig\(stats='device'\)"),
        ({"scan_backend": "fused", "stats": "deferred"}, r"needs NewtonConfig\(stats='device'\)"),
        ({"scan_backend": "triton", "stats": "device", "tol": 1e-6}, r"tol=None"),
    ],
)
def test_capture_of_a_waiting_solve_raises(settings: dict[str, object], message: str) -> None:
    dev = torch.device("cuda")
    cell = pc.ParaGRU(16, 16).to(dev)
    x = torch.randn(2, 64, 16, device=dev)
    config = pc.NewtonConfig(**settings)  # type: ignore[arg-type]
    with torch.no_grad():
        pc.newton_apply(cell, x, config=config)  # warm: kernels compiled
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with pytest.raises(RuntimeError, match=message), torch.cuda.graph(graph):
            pc.newton_apply(cell, x, config=config)
