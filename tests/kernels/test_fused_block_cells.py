"""The fused ParaLSTM and ParaSLSTM kernels against the float64 step loop: forward, every gradient.

Each kernel (Newton, sequential, backward) is compared with the pure-torch recurrence in float64
and autograd through it. CPU cases run the kernels in the Triton interpreter at small sizes, with
small chunks so that a sequence spans several chunks and segments; ``cuda`` cases run the
compiled kernels at real sizes. Every state component, every gate block of ``∂L/∂u`` and every
parameter gradient is checked on its own scale.

Tolerances: float32 ≤ 1e-5 relative to the largest reference value; bfloat16 storage ≤ 3e-2,
as for the GRU (bf16 rounds each input and stored state to 8 mantissa bits; the backward reads
the stored states back, for the sLSTM its log-normaliser ℓ too). Measured in the interpreter
at B=2, T=512, D=16: bf16 errors ≤ 8e-3 for both cells, states and every gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import Tensor

from pararnn_kernels.fused import (
    SLSTM_EMPTY_LOG_NORMALISER,
    FusedPlan,
    choose_fused_lstm_method,
    choose_fused_slstm_method,
    estimate_fused_lstm_seconds,
    estimate_fused_slstm_seconds,
    fused_lstm_backward,
    fused_lstm_newton,
    fused_lstm_sequential,
    fused_slstm_backward,
    fused_slstm_newton,
    fused_slstm_sequential,
    plan_fused_lstm,
    plan_fused_slstm,
    reference_lstm_sequential,
    reference_slstm_sequential,
)
from pararnn_kernels.fused import _layer as fused_layer
from pararnn_kernels.fused.lstm import LSTM as LSTM_SPEC
from pararnn_kernels.fused.slstm import SLSTM as SLSTM_SPEC
from pararnn_kernels.scan.launch import triton_next_power_of_2
from pararnn_kernels.testing import assert_close

from .conftest import needs_cuda, needs_interpreter

F32_TOL = 1e-5
BF16_TOL = 3e-2


@dataclass(frozen=True)
class BlockCell:
    """One block cell's fused functions and how to draw a layer for it."""

    name: str
    k: int
    gates: tuple[str, ...]
    weight_rows: tuple[int, ...]
    newton: Callable[..., Any]
    backward: Callable[..., tuple[Tensor, ...]]
    sequential: Callable[..., Tensor]
    reference: Callable[..., Tensor]
    plan: Callable[..., FusedPlan]
    choose: Callable[..., str]
    estimate: Callable[..., dict[str, float]]
    empty: tuple[float, ...]

    def layer(self, batch: int, steps: int, channels: int, device: str):
        """``u``, the recurrent parameters and a non-trivial ``h0``, like the cell's init."""
        u = torch.randn(batch, steps, len(self.gates) * channels, device=device)
        if self.name == "slstm":
            # ParaSLSTM's init: nn.Linear of unit-variance inputs (variance 1/3), forget bias
            # -2, input gate at half scale. (At unit variance 3 Newton updates per chunk leave
            # ~1e-5; the LSTM is tested at unit variance.)
            u /= 3**0.5
            u[..., 2 * channels : 3 * channels] -= 2.0
            u[..., channels : 2 * channels] *= 0.5
        weights = [
            0.25 * (2 * torch.rand(r, channels, device=device) - 1) for r in self.weight_rows
        ]
        h0 = (0.5 * torch.randn(batch, channels, self.k, device=device)).clamp(-1, 1)
        if self.name == "slstm":
            h0[..., 1] = torch.randn(batch, channels, device=device)  # a finite log-normaliser
        return u, weights, h0

    def empty_state(self, batch: int, channels: int, like: Tensor) -> Tensor:
        state = torch.zeros(batch, channels, self.k, device=like.device, dtype=like.dtype)
        for j, value in enumerate(self.empty):
            state[..., j] = value
        return state


LSTM = BlockCell(
    "lstm",
    2,
    ("f", "z", "o"),
    (3, 2),
    fused_lstm_newton,
    fused_lstm_backward,
    fused_lstm_sequential,
    reference_lstm_sequential,
    plan_fused_lstm,
    choose_fused_lstm_method,
    estimate_fused_lstm_seconds,
    (0.0, 0.0),
)
SLSTM = BlockCell(
    "slstm",
    3,
    ("z", "i", "f", "o"),
    (4,),
    fused_slstm_newton,
    fused_slstm_backward,
    fused_slstm_sequential,
    reference_slstm_sequential,
    plan_fused_slstm,
    choose_fused_slstm_method,
    estimate_fused_slstm_seconds,
    (0.0, SLSTM_EMPTY_LOG_NORMALISER, 0.0),
)
CELLS = [pytest.param(LSTM, id="lstm"), pytest.param(SLSTM, id="slstm")]
#: Each cell's kernel spec (its default tiles), by name.
SPECS = {"lstm": LSTM_SPEC, "slstm": SLSTM_SPEC}


def _reference(cell: BlockCell, u: Tensor, weights: list[Tensor], h0: Tensor | None, grad):
    """float64 states and the gradients of ``<grad, states>`` by autograd through the loop."""
    u64 = u.detach().double().requires_grad_()
    w64 = [w.detach().double().requires_grad_() for w in weights]
    start = h0 if h0 is not None else cell.empty_state(u.shape[0], weights[0].shape[1], u)
    h64 = start.detach().double().requires_grad_()
    states = cell.reference(u64, *w64, h64)
    g_u, g_h, *g_w = torch.autograd.grad(states, (u64, h64, *w64), grad.double())
    return states.detach(), g_u, g_h, g_w


def _check_states(cell: BlockCell, got: Tensor, ref: Tensor, tol: float, label: str) -> None:
    for j in range(cell.k):
        assert_close(got[..., j], ref[..., j], tol=tol, name=f"{label} component {j}")


def _check_layer(cell, u, weights, h0, plan, tol, label, *, backward_block_t=None, **newton_kw):
    channels = weights[0].shape[1]
    grad = torch.randn(u.shape[0], u.shape[1], channels, cell.k, device=u.device)
    ref_states, ref_gu, ref_gh, ref_gw = _reference(cell, u, weights, h0, grad)
    low_u = u.to(torch.bfloat16) if tol != F32_TOL else u
    result = cell.newton(low_u, *weights, h0, plan=plan, **newton_kw)
    assert result.states.dtype == low_u.dtype
    assert result.states.shape == ref_states.shape
    _check_states(cell, result.states, ref_states, tol, f"states {label}")
    assert len(result.residuals) == result.iters + 1
    if tol == F32_TOL:
        assert result.max_residual <= 1e-5, f"{label}: stopped at residual {result.max_residual}"
    sequential = cell.sequential(low_u, *weights, h0)
    _check_states(cell, sequential, ref_states, tol, f"sequential {label}")
    grads = cell.backward(
        low_u, *weights, h0, ref_states.to(low_u.dtype), grad, block_t=backward_block_t
    )
    _check_gradients(cell, weights, grads, (ref_gu, ref_gh, ref_gw), tol, label)


def _check_gradients(cell, weights, grads, refs, tol, label):
    """``grads`` ``(∂u, ∂h0, ∂parameter...)`` against ``refs`` ``(∂u, ∂h0, [∂parameter...])``
    of :func:`_reference`, ``∂u`` gate by gate."""
    (g_u, g_h, *g_w), (ref_gu, ref_gh, ref_gw) = grads, refs
    channels = weights[0].shape[1]
    assert g_u.shape == ref_gu.shape and g_h.shape == ref_gh.shape
    for i, gate in enumerate(cell.gates):
        block = slice(i * channels, (i + 1) * channels)
        assert_close(g_u[..., block], ref_gu[..., block], tol=tol, name=f"grad u_{gate} {label}")
    _check_states(cell, g_h, ref_gh, tol, f"grad h0 {label}")
    for i, (got, ref) in enumerate(zip(g_w, ref_gw, strict=True)):
        assert got.dtype == weights[i].dtype
        assert_close(got, ref, tol=tol, name=f"grad parameter {i} {label}")


@needs_interpreter
@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("segments", [1, 3])
@pytest.mark.parametrize("steps", [1, 17, 63])
@pytest.mark.parametrize("with_h0", [True, False], ids=["h0", "empty-h0"])
def test_fused_block_cell_in_interpreter(poisoned, cell, steps, segments, with_h0):
    u, weights, h0 = cell.layer(2, steps, 5, "cpu")
    plan = FusedPlan(block_t=16, block_d=4, segments=segments)
    _check_layer(
        cell,
        u,
        weights,
        h0 if with_h0 else None,
        plan,
        F32_TOL,
        f"{cell.name} T={steps} S={segments}",
        backward_block_t=16,
    )


@needs_interpreter
@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("segments", [1, 3])
@pytest.mark.parametrize("steps", [1, 17, 63])
def test_fused_block_cell_uncoupled_guess_in_interpreter(poisoned, cell, steps, segments):
    u, weights, h0 = cell.layer(2, steps, 5, "cpu")
    plan = FusedPlan(block_t=16, block_d=4, segments=segments)
    label = f"{cell.name} uncoupled T={steps} S={segments}"
    _check_layer(
        cell, u, weights, h0, plan, F32_TOL, label, backward_block_t=16, initial_guess="uncoupled"
    )


@needs_interpreter
@pytest.mark.parametrize("cell", CELLS)
def test_fused_block_cell_uncoupled_guess_saves_an_update_in_interpreter(poisoned, cell):
    # Each chunk's guess solves the memory of the gates of the inputs (the sLSTM's
    # log-normaliser above all) from the chunk's exact start state: measured 2 updates per chunk
    # where one step's guess takes 3 (to the default 1e-6).
    u, weights, h0 = cell.layer(2, 96, 5, "cpu")
    plan = FusedPlan(block_t=32, block_d=4)
    step = cell.newton(u, *weights, h0, plan=plan, max_iters=8)
    uncoupled = cell.newton(u, *weights, h0, plan=plan, max_iters=8, initial_guess="uncoupled")
    assert uncoupled.residuals[0] < step.residuals[0]
    assert uncoupled.iters < step.iters, (uncoupled.residuals, step.residuals)
    ref = cell.reference(u.double(), *(w.double() for w in weights), h0.double())
    _check_states(cell, uncoupled.states, ref, F32_TOL, f"{cell.name} states (uncoupled)")


def _long_memory(cell: BlockCell, u: Tensor, channels: int, width: int) -> Tensor:
    """``u`` with the first ``channels`` of ``width`` channels keeping their cell state: the
    LSTM's forget gate open (``1 - f ≈ 4e-18``), the sLSTM's forget gate open and input gate
    shut (``λ ≈ e^-40``). Those channels carry their start state through the whole sequence, so
    a time segment's guessed start state is wrong there and the error never dies out: each
    segment's correcting walk runs to its end, and the next one must start from that end. The
    gates are set far enough that float32 and the float64 reference agree over 20000 steps
    (at ±20 the reference's leak, ``T·e^-20 ≈ 4e-5`` relative, is below float32's step)."""
    u = u.clone()
    gate = {name: i * width for i, name in enumerate(cell.gates)}
    u[..., gate["f"] : gate["f"] + channels] = 40.0
    if "i" in gate:
        u[..., gate["i"] : gate["i"] + channels] = -40.0
    return u


@needs_interpreter
@pytest.mark.parametrize("cell", CELLS)
def test_fused_block_cell_segments_chain_a_long_memory_in_interpreter(poisoned, cell):
    u, weights, h0 = cell.layer(2, 80, 5, "cpu")
    u = _long_memory(cell, u, 3, 5)
    plan = FusedPlan(block_t=8, block_d=4, segments=4)  # 4 segments of 3 chunks (the last 2)
    # (The sLSTM's guesses are far off here, its ℓ by ~20: unsplit too it needs 4 updates.)
    result = cell.newton(u, *weights, h0, plan=plan, max_iters=8)
    assert result.passes == 2
    # The scenario holds: the cell state carried to the last step.
    assert (result.states[:, -1, :3, 0] - h0[:, :3, 0]).abs().max() < 1e-5
    label = f"{cell.name} long memory"
    _check_layer(cell, u, weights, h0, plan, F32_TOL, label, backward_block_t=8, max_iters=8)


@needs_interpreter
@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("shape", [(2, 17, 5), (2, 17, 13)], ids=["narrow", "beyond-narrow"])
def test_fused_block_cell_default_backward_tiles_in_interpreter(poisoned, monkeypatch, cell, shape):
    # The backward with no tile arguments: the narrow tile while B·D is at most the threshold,
    # the cell's default tile beyond. The threshold (2^10 channels) is lowered to 16 here, so
    # that B·D = 26 takes the default tile at a size the interpreter runs in seconds (13
    # channels: a partial channel block of the 8-channel tiles; T = 17: partial chunks).
    threshold = 16
    monkeypatch.setattr(fused_layer, "_NARROW_BACKWARD", threshold)
    launches: list[dict[str, Any]] = []
    launchable = fused_layer.launchable

    def recorded(kernel: Any) -> Any:
        target = launchable(kernel)

        class Recorder:
            def __getitem__(self, grid: Any) -> Any:
                def launch(*args: Any, **kwargs: Any) -> Any:
                    launches.append(kwargs)
                    return target[grid](*args, **kwargs)

                return launch

        return Recorder()

    monkeypatch.setattr(fused_layer, "launchable", recorded)
    batch, steps, channels = shape
    u, weights, h0 = cell.layer(batch, steps, channels, "cpu")
    grad = torch.randn(batch, steps, channels, cell.k)
    ref_states, *refs = _reference(cell, u, weights, h0, grad)
    launches.clear()
    grads = cell.backward(u, *weights, h0, ref_states.float(), grad)
    _check_gradients(cell, weights, grads, refs, F32_TOL, f"{cell.name} default backward {shape}")
    spec = SPECS[cell.name]
    narrow = batch * channels <= threshold
    block_t, block_d, warps = spec.backward_narrow if narrow else spec.backward_tile
    tile = (block_t, min(block_d, triton_next_power_of_2(channels)), warps)
    assert [(k["BLOCK_T"], k["BLOCK_D"], k["num_warps"]) for k in launches] == [tile]


#: (block_d, rows, num_warps, vec) plans of the sequential kernels: the default (64 channels,
#: 8 steps per tile, 2 channels per thread), 16 steps as the GRU's default, other widths, a
#: tile longer than the sequence.
SEQUENTIAL_PLANS = [
    (None, None, None, None),
    (64, 16, 1, 2),
    (32, 4, 1, 1),
    (16, 8, 1, 4),
    (8, 32, 1, 1),
]


def _check_sequential_plans(cell, batch, steps, channels, device):
    u, weights, h0 = cell.layer(batch, steps, channels, device)
    ref = cell.reference(u.double(), *[w.double() for w in weights], h0.double())
    for bd, rows, warps, vec in SEQUENTIAL_PLANS:
        states = cell.sequential(u, *weights, h0, block_d=bd, rows=rows, num_warps=warps, vec=vec)
        _check_states(cell, states, ref, F32_TOL, f"{cell.name} sequential {bd}x{rows} v{vec}")


@needs_interpreter
@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("steps", [1, 17, 63])
def test_fused_block_cell_sequential_plans_in_interpreter(poisoned, cell, steps):
    # D = 37: partial channel blocks at every block_d; T = 17, 63: partial row tiles.
    _check_sequential_plans(cell, 2, steps, 37, "cpu")


@needs_interpreter
@pytest.mark.parametrize("cell", CELLS)
def test_fused_block_cell_sequential_rejects_bad_plans(cell):
    u, weights, h0 = cell.layer(1, 4, 8, "cpu")
    with pytest.raises(ValueError, match="rows must be a power of two, got 3"):
        cell.sequential(u, *weights, h0, rows=3)
    with pytest.raises(ValueError, match="block_d must be a power of two, got 12"):
        cell.sequential(u, *weights, h0, block_d=12)
    with pytest.raises(ValueError, match="vec must be a power of two from 1 to block_d = 8"):
        cell.sequential(u, *weights, h0, block_d=8, vec=16)


@needs_interpreter
@pytest.mark.parametrize("cell", CELLS)
def test_fused_block_cell_initial_state_guess_in_interpreter(poisoned, cell):
    # "initial_state" starts Newton (and the segment guesses) from the empty state, which for
    # the sLSTM is ℓ = -1e4 rather than zeros: a first residual of ~1e4 that Newton removes.
    u, weights, h0 = cell.layer(2, 40, 3, "cpu")
    plan = FusedPlan(block_t=8, block_d=4, segments=2)
    _check_layer(
        cell,
        u,
        weights,
        h0,
        plan,
        F32_TOL,
        f"{cell.name} initial_state",
        backward_block_t=8,
        initial_guess="initial_state",
        max_iters=8,
    )


@needs_interpreter
@pytest.mark.parametrize("cell", CELLS)
def test_fused_block_cell_bf16_storage_in_interpreter(poisoned, cell):
    u, weights, h0 = cell.layer(2, 40, 6, "cpu")
    plan = FusedPlan(block_t=16, block_d=8)
    _check_layer(cell, u, weights, h0, plan, BF16_TOL, "bf16", backward_block_t=16)


@needs_interpreter
@pytest.mark.parametrize("cell", CELLS)
def test_fused_block_cell_reports_nan_as_non_finite(poisoned, cell):
    u, weights, h0 = cell.layer(1, 20, 4, "cpu")
    u[0, 7, 2] = float("nan")
    result = cell.newton(u, *weights, h0, plan=FusedPlan(block_t=16, block_d=4))
    assert result.max_residual == float("inf")  # a NaN is reported as non-finite, not hidden
    assert float("inf") in result.residuals


@needs_interpreter
@pytest.mark.parametrize("cell", CELLS)
def test_fused_block_cell_tolerance_stops_early(poisoned, cell):
    u, weights, h0 = cell.layer(1, 32, 4, "cpu")
    plan = FusedPlan(block_t=16, block_d=4)
    loose = cell.newton(u, *weights, h0, tol=1e-1, plan=plan)
    tight = cell.newton(u, *weights, h0, max_iters=6, plan=plan)
    assert loose.iters < tight.iters
    assert loose.max_residual <= 1e-1 and tight.max_residual <= 1e-5


def test_fused_lstm_bad_input_names_the_argument():
    u, (w, p), h0 = LSTM.layer(2, 8, 4, "cpu")
    with pytest.raises(ValueError, match=r"u must be \[B, T, 3D\]"):
        fused_lstm_newton(u[0], w, p, h0)
    with pytest.raises(ValueError, match=r"u's last axis must be 3D \(gates f, z, o\)"):
        fused_lstm_newton(u[..., :-1], w, p, h0)
    with pytest.raises(
        ValueError, match=r"recurrent_weight must be \[3, D\] = \[3, 4\], got \(3, 5\)"
    ):
        fused_lstm_newton(u, torch.zeros(3, 5), p, h0)
    with pytest.raises(
        ValueError, match=r"peephole_weight must be \[2, D\] = \[2, 4\], got \(3, 4\)"
    ):
        fused_lstm_newton(u, w, torch.zeros(3, 4), h0)
    with pytest.raises(ValueError, match=r"h0 must be \[B, D, 2\] = \[2, 4, 2\], got \(2, 4\)"):
        fused_lstm_newton(u, w, p, h0[..., 0])
    with pytest.raises(ValueError, match=r"float32, float16 or bfloat16; got u of torch\.float64"):
        fused_lstm_newton(u.double(), w, p, h0)
    with pytest.raises(ValueError, match="max_iters must be an int >= 1"):
        fused_lstm_newton(u, w, p, h0, max_iters=0)
    with pytest.raises(
        ValueError, match=r"grad_states must be \[B, T, D, 2\] = \[2, 8, 4, 2\], got \(2, 8, 4\)"
    ):
        fused_lstm_backward(u, w, p, h0, torch.zeros(2, 8, 4, 2), torch.zeros(2, 8, 4))


def test_fused_slstm_bad_input_names_the_argument():
    u, (w,), h0 = SLSTM.layer(2, 8, 4, "cpu")
    with pytest.raises(ValueError, match=r"u's last axis must be 4D \(gates z, i, f, o\)"):
        fused_slstm_newton(u[..., :-1], w, h0)
    with pytest.raises(
        ValueError, match=r"recurrent_weight must be \[4, D\] = \[4, 4\], got \(3, 4\)"
    ):
        fused_slstm_newton(u, w[:3], h0)
    with pytest.raises(ValueError, match=r"h0 must be \[B, D, 3\] = \[2, 4, 3\], got \(2, 4, 2\)"):
        fused_slstm_sequential(u, w, h0[..., :2])
    with pytest.raises(ValueError, match=r"states must be \[B, T, D, 3\]"):
        fused_slstm_backward(u, w, h0, torch.zeros(2, 8, 4, 2), torch.zeros(2, 8, 4, 3))


@pytest.mark.parametrize("cell", CELLS)
def test_block_plans_and_cost_models_are_sane(cell, monkeypatch):
    # The model on an H200-sized device (132 multiprocessors), on CPU tensors.
    monkeypatch.setattr("pararnn_kernels.fused._layer.multiprocessor_count", lambda device: 132)
    cpu = torch.device("cpu")
    assert cell.plan(64, 4096, 1024, cpu).segments == 1  # many programs: no segments
    assert cell.plan(1, 65536, 16, cpu).segments > 1  # few programs: split time
    assert cell.plan(1, 1024, 256, cpu).segments <= 2  # ... hardly where the chains are short
    assert cell.plan(1, 100, 16, cpu, block_t=8).block_t == 8
    with pytest.raises(ValueError, match="segments must be >= 1"):
        cell.plan(1, 100, 16, cpu, segments=0)
    # The picks measured in docs/benchmarks.md (2026-12-06): long latency-bound sequences go to
    # Newton (1.26-1.85x faster at T = 1024 already); bandwidth-bound ones (B·D = 8192: the
    # sequential kernel 1.7-2.6x faster; B·D = 2^16) and a single step to the sequential kernel.
    # At T = 512 Newton was 1.64x faster for the LSTM and 1.17x for the sLSTM.
    assert cell.choose(8, 512, 256, cpu, torch.float32) == "newton"
    assert cell.choose(8, 1024, 256, cpu, torch.float32) == "newton"
    assert cell.choose(8, 4096, 256, cpu, torch.float32) == "newton"
    assert cell.choose(1, 65536, 256, cpu, torch.float32) == "newton"
    assert cell.choose(32, 4096, 256, cpu, torch.float32) == "sequential"
    assert cell.choose(8, 4096, 1024, cpu, torch.float32) == "sequential"
    assert cell.choose(64, 4096, 1024, cpu, torch.float32) == "sequential"
    assert cell.choose(4, 1, 16, cpu, torch.float32) == "sequential"
    # The pick is the smaller estimate, and the estimates grow with T.
    for shape in [(8, 512, 256), (8, 4096, 256), (64, 4096, 1024)]:
        estimate = cell.estimate(*shape, cpu, torch.float32)
        assert set(estimate) == {"newton", "sequential"}
        assert cell.choose(*shape, cpu, torch.float32) == min(estimate, key=estimate.__getitem__)
    short, long = (cell.estimate(8, t, 256, cpu, torch.float32) for t in (1024, 4096))
    assert all(0 < short[k] < long[k] for k in short)


CUDA_SHAPES = [(8, 4096, 256), (8, 16384, 256), (1, 65536, 256), (3, 17, 250), (2, 1, 7)]


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("shape", CUDA_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_fused_block_cell_on_gpu(poisoned, cell, shape):
    batch, steps, channels = shape
    u, weights, h0 = cell.layer(batch, steps, channels, "cuda")
    _check_layer(cell, u, weights, h0, None, F32_TOL, f"cuda {cell.name} {shape}")


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("shape", [(8, 4096, 256), (1, 65536, 256)], ids=["8x4096", "1x65536"])
def test_fused_block_cell_uncoupled_guess_on_gpu(poisoned, cell, shape):
    u, weights, h0 = cell.layer(*shape, "cuda")
    label = f"cuda {cell.name} uncoupled {shape}"
    _check_layer(cell, u, weights, h0, None, F32_TOL, label, initial_guess="uncoupled")
    step = cell.newton(u, *weights, h0)
    uncoupled = cell.newton(u, *weights, h0, initial_guess="uncoupled")
    # The most updates any of the many chunks ran: no more than one step's guess needs.
    assert uncoupled.iters <= step.iters, (uncoupled.residuals, step.residuals)
    assert uncoupled.residuals[0] < step.residuals[0]


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("segments", [2, 16])
@pytest.mark.parametrize("long_memory", [False, True], ids=["forgetting", "long-memory"])
def test_fused_block_cell_segments_on_gpu(poisoned, cell, segments, long_memory):
    u, weights, h0 = cell.layer(2, 20000, 96, "cuda")
    if long_memory:
        u = _long_memory(cell, u, 40, 96)
    plan = cell.plan(2, 20000, 96, torch.device("cuda"), segments=segments)
    label = f"cuda {cell.name} segments={segments} {long_memory=}"
    _check_layer(cell, u, weights, h0, plan, F32_TOL, label, max_iters=8)


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("shape", [(8, 4096, 256), (3, 1000, 1000), (2, 1, 7)])
def test_fused_block_cell_sequential_plans_on_gpu(poisoned, cell, shape):
    _check_sequential_plans(cell, *shape, "cuda")


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("cell", CELLS)
def test_fused_block_cell_bf16_on_gpu(poisoned, cell):
    if not torch.cuda.is_bf16_supported():
        pytest.skip("bfloat16 storage needs compute capability >= 8.0")
    u, weights, h0 = cell.layer(8, 4096, 256, "cuda")
    _check_layer(cell, u, weights, h0, None, BF16_TOL, f"cuda {cell.name} bf16")


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("cell", CELLS)
def test_fused_block_cell_backward_is_bitwise_deterministic(cell):
    u, weights, h0 = cell.layer(8, 8192, 256, "cuda")
    states = cell.newton(u, *weights, h0).states
    grad = torch.randn_like(states)
    first = cell.backward(u, *weights, h0, states, grad)
    for _ in range(3):
        again = cell.backward(u, *weights, h0, states, grad)
        for a, b in zip(first, again, strict=True):
            assert torch.equal(a, b)
