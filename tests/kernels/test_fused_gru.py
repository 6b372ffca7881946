"""The fused GRU kernels against the float64 step loop: forward, every gradient, determinism.

CPU cases run the kernels in the Triton interpreter at small sizes, with small chunks so that a
sequence spans several chunks and segments; ``cuda`` cases run the compiled kernels at real
sizes. Tolerances: float32 ≤ 1e-5 relative to the largest reference value (states and every
gradient); bfloat16 storage ≤ 3e-2 (bf16 rounds each stored state and input to 8 mantissa bits).
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from pararnn_kernels.fused import (
    FusedPlan,
    choose_fused_gru_method,
    fused_gru_backward,
    fused_gru_newton,
    fused_gru_sequential,
    plan_fused_gru,
    reference_gru_sequential,
)
from pararnn_kernels.testing import assert_close

from .conftest import needs_cuda, needs_interpreter

F32_TOL = 1e-5
BF16_TOL = 3e-2


def _layer(batch: int, steps: int, channels: int, device: str, *, scale: float = 1.0):
    u = scale * torch.randn(batch, steps, 3 * channels, device=device)
    weight = 0.25 * (2 * torch.rand(3, channels, device=device) - 1)
    h0 = 0.5 * torch.randn(batch, channels, device=device)
    return u, weight, h0


def _reference(u: Tensor, weight: Tensor, h0: Tensor | None, grad: Tensor):
    """float64 states and the gradients of ``<grad, states>`` by autograd through the loop."""
    u64 = u.detach().double().requires_grad_()
    w64 = weight.detach().double().requires_grad_()
    h64 = (h0 if h0 is not None else torch.zeros_like(u[:, 0, : weight.shape[1]])).double()
    h64 = h64.detach().requires_grad_()
    states = reference_gru_sequential(u64, w64, h64)
    g_u, g_w, g_h = torch.autograd.grad(states, (u64, w64, h64), grad.double())
    return states.detach(), g_u, g_w, g_h


def _check_layer(u, weight, h0, plan, tol, label, *, backward_block_t=64, **newton_kw):
    grad = torch.randn(u.shape[0], u.shape[1], weight.shape[1], device=u.device)
    ref_states, ref_gu, ref_gw, ref_gh = _reference(u, weight, h0, grad)
    low_u = u.to(torch.bfloat16) if tol == BF16_TOL else u
    result = fused_gru_newton(low_u, weight, h0, plan=plan, **newton_kw)
    assert result.states.dtype == low_u.dtype
    assert_close(result.states, ref_states, tol=tol, name=f"states {label}")
    assert result.max_residual <= 1e-5, f"{label}: stopped at residual {result.max_residual}"
    assert len(result.residuals) == result.iters + 1
    sequential = fused_gru_sequential(low_u, weight, h0)
    assert_close(sequential, ref_states, tol=tol, name=f"sequential {label}")
    g_u, g_h, g_w = fused_gru_backward(
        low_u, weight, h0, ref_states.to(low_u.dtype), grad, block_t=backward_block_t
    )
    assert_close(g_u, ref_gu, tol=tol, name=f"grad u {label}")
    assert_close(g_w, ref_gw, tol=tol, name=f"grad weight {label}")
    assert_close(g_h, ref_gh, tol=tol, name=f"grad h0 {label}")


@needs_interpreter
@pytest.mark.parametrize("segments", [1, 3])
@pytest.mark.parametrize("steps", [1, 17, 63])
@pytest.mark.parametrize("with_h0", [True, False], ids=["h0", "zero-h0"])
def test_fused_gru_in_interpreter(poisoned, steps, segments, with_h0):
    u, weight, h0 = _layer(2, steps, 5, "cpu")
    plan = FusedPlan(block_t=16, block_d=4, segments=segments)
    _check_layer(
        u,
        weight,
        h0 if with_h0 else None,
        plan,
        F32_TOL,
        f"T={steps} S={segments}",
        backward_block_t=16,
    )


def _shut_update_gates(u: Tensor, channels: int) -> Tensor:
    """``u`` with the update gate of the first ``channels`` channels shut (``z ≈ 4e-18``): those
    channels carry their start state through the whole sequence, so a time segment's guessed
    start state is wrong by ``h0`` there and the error never dies out: each segment's correcting
    walk runs to its end, and the next one must start from that end (the other channels forget
    within a chunk, so their walks stop early). The gate is shut far enough that float32 and
    the float64 reference agree over 20000 steps (with ``z ≈ 2e-9`` the reference drifts by
    ``T·z ≈ 4e-5``, which float32 cannot add to ``h ≈ 0.5`` one step at a time)."""
    u = u.clone()
    u[..., :channels] = -40.0
    return u


@needs_interpreter
@pytest.mark.parametrize("segments", [1, 3])
@pytest.mark.parametrize("steps", [1, 17, 63])
def test_fused_gru_uncoupled_guess_in_interpreter(poisoned, steps, segments):
    u, weight, h0 = _layer(2, steps, 5, "cpu")
    plan = FusedPlan(block_t=16, block_d=4, segments=segments)
    label = f"uncoupled T={steps} S={segments}"
    _check_layer(
        u, weight, h0, plan, F32_TOL, label, backward_block_t=16, initial_guess="uncoupled"
    )


@needs_interpreter
def test_fused_gru_uncoupled_guess_saves_an_update_in_interpreter(poisoned):
    # Each chunk's guess solves the update gate's memory from the chunk's exact start state:
    # measured 2 updates per chunk where one step's guess takes 3 (to the default 1e-6).
    u, weight, h0 = _layer(2, 96, 5, "cpu")
    plan = FusedPlan(block_t=32, block_d=4)
    step = fused_gru_newton(u, weight, h0, plan=plan, max_iters=8)
    uncoupled = fused_gru_newton(u, weight, h0, plan=plan, max_iters=8, initial_guess="uncoupled")
    assert uncoupled.residuals[0] < step.residuals[0]
    assert uncoupled.iters < step.iters, (uncoupled.residuals, step.residuals)
    ref = reference_gru_sequential(u.double(), weight.double(), h0.double())
    assert_close(uncoupled.states, ref, tol=F32_TOL, name="states (uncoupled)")


@needs_interpreter
@pytest.mark.parametrize("initial_guess", ["step", "initial_state", "uncoupled"])
def test_fused_gru_segments_chain_a_long_memory_in_interpreter(poisoned, initial_guess):
    u, weight, h0 = _layer(2, 80, 5, "cpu")
    u = _shut_update_gates(u, 3)
    plan = FusedPlan(block_t=8, block_d=4, segments=4)  # 4 segments of 3 chunks (the last 2)
    result = fused_gru_newton(u, weight, h0, plan=plan, initial_guess=initial_guess)
    assert result.passes == 2
    ref = reference_gru_sequential(u.double(), weight.double(), h0.double())
    assert_close(result.states, ref, tol=F32_TOL, name=f"states ({initial_guess})")
    assert result.max_residual <= 1e-5
    # The scenario holds: h0 carried to the last step (where the guesses start near 0).
    assert (result.states[:, -1, :3] - h0[:, :3]).abs().max() < 1e-6
    _check_layer(
        u, weight, h0, plan, F32_TOL, "long memory", backward_block_t=8, initial_guess=initial_guess
    )


@needs_interpreter
def test_fused_gru_bf16_storage_in_interpreter(poisoned):
    u, weight, h0 = _layer(2, 40, 6, "cpu")
    _check_layer(
        u, weight, h0, FusedPlan(block_t=16, block_d=8), BF16_TOL, "bf16", backward_block_t=16
    )


#: (block_d, rows, num_warps, vec) plans of the sequential kernel: the default, whole tiles
#: per thread at other widths, steps spread over threads (vectors of 4), a row tile longer
#: than the sequence.
SEQUENTIAL_PLANS = [(64, 16, 1, 2), (32, 4, 1, 1), (128, 8, 2, 2), (16, 4, 1, 4), (8, 32, 1, 1)]


def _check_sequential(batch, steps, channels, device, plans):
    u, weight, h0 = _layer(batch, steps, channels, device)
    ref_states = reference_gru_sequential(u.double(), weight.double(), h0.double())
    for bd, rows, warps, vec in plans:
        states = fused_gru_sequential(
            u, weight, h0, block_d=bd, rows=rows, num_warps=warps, vec=vec
        )
        assert_close(
            states, ref_states, tol=F32_TOL, name=f"sequential {bd}x{rows} w{warps} v{vec}"
        )


@needs_interpreter
@pytest.mark.parametrize("steps", [1, 17, 63])
def test_fused_gru_sequential_plans_in_interpreter(poisoned, steps):
    # D = 37: partial channel blocks at every block_d; T = 17, 63: partial row tiles.
    _check_sequential(2, steps, 37, "cpu", SEQUENTIAL_PLANS)


@needs_interpreter
def test_fused_gru_sequential_rejects_a_bad_vec():
    u, weight, h0 = _layer(1, 4, 8, "cpu")
    with pytest.raises(
        ValueError, match="vec must be a power of two from 1 to block_d = 16, got 3"
    ):
        fused_gru_sequential(u, weight, h0, block_d=16, vec=3)
    with pytest.raises(
        ValueError, match="vec must be a power of two from 1 to block_d = 8, got 16"
    ):
        fused_gru_sequential(u, weight, h0, block_d=8, vec=16)


@needs_interpreter
def test_fused_gru_reports_nan_as_non_finite(poisoned):
    u, weight, h0 = _layer(1, 20, 4, "cpu")
    u[0, 7, 2] = float("nan")
    result = fused_gru_newton(u, weight, h0, plan=FusedPlan(block_t=16, block_d=4))
    assert result.max_residual == float("inf")  # a NaN is reported as non-finite, not hidden
    assert float("inf") in result.residuals


@needs_interpreter
def test_fused_gru_tolerance_stops_early(poisoned):
    u, weight, h0 = _layer(1, 32, 4, "cpu")
    loose = fused_gru_newton(u, weight, h0, tol=1e-1, plan=FusedPlan(block_t=16, block_d=4))
    tight = fused_gru_newton(u, weight, h0, max_iters=6, plan=FusedPlan(block_t=16, block_d=4))
    assert loose.iters < tight.iters
    assert loose.max_residual <= 1e-1 and tight.max_residual <= 1e-6


@needs_interpreter
def test_eager_launches_bypass_the_wrap_triton_op(poisoned, refused_wrapper_launches, monkeypatch):
    """A launch through ``wrap_triton``'s higher-order op cost more host time than a whole
    Newton kernel at (8, 1024, 256) on an H200: eager calls launch the kernel itself, and the
    wrapper launches only while ``torch.compile`` traces."""
    u, weight, h0 = _layer(1, 20, 4, "cpu")
    plan = FusedPlan(block_t=16, block_d=4)
    states = fused_gru_newton(u, weight, h0, plan=plan).states
    assert_close(fused_gru_sequential(u, weight, h0), states, tol=F32_TOL, name="sequential")
    fused_gru_backward(u, weight, h0, states, torch.ones_like(states), block_t=16)
    assert len(refused_wrapper_launches) == 3  # each launcher still asked wrap_triton
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    with pytest.raises(AssertionError, match="through the wrap_triton wrapper"):
        fused_gru_newton(u, weight, h0, plan=plan)


def test_fused_gru_bad_input_names_the_argument():
    u, weight, h0 = _layer(2, 8, 4, "cpu")
    with pytest.raises(ValueError, match=r"u must be \[B, T, 3D\]"):
        fused_gru_newton(u[0], weight, h0)
    with pytest.raises(ValueError, match="u's last axis must be 3D"):
        fused_gru_newton(u[..., :-1], weight, h0)
    with pytest.raises(ValueError, match=r"weight must be \[3, D\] = \[3, 4\], got \(3, 5\)"):
        fused_gru_newton(u, torch.zeros(3, 5), h0)
    with pytest.raises(ValueError, match=r"h0 must be \[B, D\] = \[2, 4\], got \(4,\)"):
        fused_gru_newton(u, weight, h0[0])
    with pytest.raises(ValueError, match=r"float32, float16 or bfloat16; got u of torch\.float64"):
        fused_gru_newton(u.double(), weight, h0)
    with pytest.raises(ValueError, match="max_iters must be an int >= 1"):
        fused_gru_newton(u, weight, h0, max_iters=0)
    with pytest.raises(
        ValueError, match=r"initial_guess must be one of \[.*'uncoupled'\], got 'ze"
    ):
        fused_gru_newton(u, weight, h0, initial_guess="zeros")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"grad_states must be \[B, T, D\]"):
        fused_gru_backward(u, weight, h0, torch.zeros(2, 8, 4), torch.zeros(2, 8, 5))


def test_plan_and_cost_model_are_sane(monkeypatch):
    # An H200's 132 multiprocessors, so the picks are the ones measured in docs/benchmarks.md.
    monkeypatch.setattr("pararnn_kernels.fused._layer.multiprocessor_count", lambda device: 132)
    cpu = torch.device("cpu")
    assert plan_fused_gru(64, 4096, 1024, cpu).segments == 1  # many programs: no segments
    assert plan_fused_gru(1, 65536, 256, cpu).segments == 8  # few programs: split time
    assert plan_fused_gru(1, 100, 16, cpu).segments == 1  # a single chunk is never split
    # Segments up to four programs per multiprocessor, where the chains they cut outweigh the
    # links they add: at one row of 256 channels (64 programs) none at T = 1024, more with T,
    # up to 8 (512 programs; 16 would be 1024, more than run at once).
    picks = [plan_fused_gru(1, t, 256, cpu).segments for t in (1024, 4096, 16384, 65536)]
    assert picks == [1, 4, 8, 8]
    assert plan_fused_gru(1, 65536, 64, cpu).segments == 16
    assert plan_fused_gru(8, 4096, 256, cpu).segments == 1  # 512 programs: enough already
    with pytest.raises(ValueError, match="segments must be >= 1"):
        plan_fused_gru(1, 100, 16, cpu, segments=0)
    picks = {
        shape: choose_fused_gru_method(*shape, cpu, torch.float32)
        for shape in [
            (8, 128, 256),
            (8, 256, 256),
            (8, 512, 256),
            (8, 1024, 256),
            (8, 4096, 256),
            (8, 16384, 256),
            (64, 4096, 1024),
            (1, 65536, 256),
        ]
    }
    assert picks == {
        (8, 128, 256): "sequential",
        # Newton 1.65-1.78x and 2.2x faster (docs/benchmarks.md, 2026-12-06, three rounds).
        (8, 256, 256): "newton",
        (8, 512, 256): "newton",
        (8, 1024, 256): "newton",
        (8, 4096, 256): "newton",
        (8, 16384, 256): "newton",
        (64, 4096, 1024): "sequential",
        (1, 65536, 256): "newton",
    }


CUDA_SHAPES = [(8, 4096, 256), (1, 65536, 256), (64, 1024, 1000), (3, 17, 250), (2, 1, 7)]


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("shape", CUDA_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_fused_gru_on_gpu(poisoned, shape):
    batch, steps, channels = shape
    u, weight, h0 = _layer(batch, steps, channels, "cuda")
    _check_layer(u, weight, h0, None, F32_TOL, f"cuda {shape}")


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("shape", [(8, 4096, 256), (1, 65536, 256)], ids=["8x4096", "1x65536"])
def test_fused_gru_uncoupled_guess_on_gpu(poisoned, shape):
    u, weight, h0 = _layer(*shape, "cuda")
    _check_layer(u, weight, h0, None, F32_TOL, f"cuda uncoupled {shape}", initial_guess="uncoupled")
    step = fused_gru_newton(u, weight, h0)
    uncoupled = fused_gru_newton(u, weight, h0, initial_guess="uncoupled")
    # The most updates any of the many chunks ran: no more than one step's guess needs.
    assert uncoupled.iters <= step.iters, (uncoupled.residuals, step.residuals)
    assert uncoupled.residuals[0] < step.residuals[0]


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("segments", [2, 16])
@pytest.mark.parametrize("long_memory", [False, True], ids=["forgetting", "long-memory"])
def test_fused_gru_segments_on_gpu(poisoned, segments, long_memory):
    u, weight, h0 = _layer(2, 20000, 96, "cuda")
    if long_memory:
        u = _shut_update_gates(u, 40)
    plan = FusedPlan(segments=segments)
    _check_layer(u, weight, h0, plan, F32_TOL, f"cuda segments={segments} {long_memory=}")


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("shape", [(8, 4096, 256), (3, 1000, 1000), (2, 1, 7)])
def test_fused_gru_sequential_plans_on_gpu(poisoned, shape):
    _check_sequential(*shape, "cuda", SEQUENTIAL_PLANS)


@pytest.mark.cuda
@needs_cuda
def test_fused_gru_bf16_on_gpu(poisoned):
    u, weight, h0 = _layer(8, 4096, 256, "cuda")
    _check_layer(u, weight, h0, None, BF16_TOL, "cuda bf16")


@pytest.mark.cuda
@needs_cuda
def test_fused_gru_backward_is_bitwise_deterministic():
    u, weight, h0 = _layer(8, 8192, 256, "cuda")
    states = fused_gru_newton(u, weight, h0).states
    grad = torch.randn_like(states)
    first = fused_gru_backward(u, weight, h0, states, grad)
    for _ in range(3):
        again = fused_gru_backward(u, weight, h0, states, grad)
        for a, b in zip(first, again, strict=True):
            assert torch.equal(a, b)
