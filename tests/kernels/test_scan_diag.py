"""scan_diag: every backend, both directions, with and without h0, forward and every gradient,
against a float64 sequential loop (and autograd through it)."""

from __future__ import annotations

from typing import Any
from unittest import mock

import pytest
import torch
from torch import Tensor

from pararnn_kernels import scan_diag, sequential_scan_diag
from pararnn_kernels.dispatch import multiprocessor_count
from pararnn_kernels.scan import launch
from pararnn_kernels.scan.reference import reference_scan_diag, reference_scan_diag_backward
from pararnn_kernels.testing import assert_close

from .conftest import Case, check_against_sequential, needs_cuda, needs_interpreter
from .conftest import sequential_with_grads as oracle_with_grads

# Relative error (max |err| / max |ref|) allowed per storage dtype, forward and gradients.
# fp16/bf16 store inputs, outputs and the saved y rounded (2^-11, 2^-8 relative), so the
# references are computed from the rounded inputs and the bounds are a few output roundings.
FORWARD_TOL = {
    torch.float64: 1e-12,
    torch.float32: 1e-5,
    torch.float16: 2e-3,
    torch.bfloat16: 1.6e-2,
}
GRAD_TOL = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}

STEPS = [1, 2, 17, 63, 1000]


def make_inputs(
    batch: int, steps: int, channels: int, *, dtype: torch.dtype, device: str, with_h0: bool
) -> tuple[Tensor, Tensor, Tensor | None]:
    # Multipliers of both signs, inside the unit disc: a contracting recurrence.
    jac = (0.95 * (2 * torch.rand(batch, steps, channels, dtype=torch.float64) - 1)).to(dtype)
    rhs = torch.randn(batch, steps, channels, dtype=torch.float64).to(dtype)
    h0 = torch.randn(batch, channels, dtype=torch.float64).to(dtype) if with_h0 else None
    return jac.to(device), rhs.to(device), (h0.to(device) if h0 is not None else None)


def sequential_with_grads(
    jac: Tensor, rhs: Tensor, h0: Tensor | None, grad_y: Tensor, reverse: bool
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    return oracle_with_grads(sequential_scan_diag, jac, rhs, h0, grad_y, reverse)


def check_scan_diag(
    inputs: tuple[Tensor, Tensor, Tensor | None], grad_y: Tensor, *, reverse: bool, backend: str
) -> None:
    """``scan_diag`` on ``(jac, rhs, h0)`` against the float64 loop, at the tolerances of the
    storage dtype; failures name the dtype and the shape."""
    jac, rhs, h0 = inputs
    check_against_sequential(
        scan_diag,
        sequential_scan_diag,
        jac,
        rhs,
        h0,
        grad_y,
        reverse=reverse,
        backend=backend,
        forward_tol=FORWARD_TOL[rhs.dtype],
        grad_tol=GRAD_TOL[rhs.dtype],
        label=f"{rhs.dtype} {tuple(rhs.shape)}",
    )


def sizes(case: Case) -> tuple[int, int]:
    return (2, 5) if case.small else (3, 37)


@pytest.mark.parametrize("steps", STEPS)
@pytest.mark.parametrize("with_h0", [False, True], ids=["zero-h0", "h0"])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_forward_and_gradients_match_sequential(
    case: Case, steps: int, with_h0: bool, reverse: bool, poisoned: None
) -> None:
    batch, channels = sizes(case)
    dtypes = [torch.float32] + ([torch.float64] if case.backend == "eager" else [])
    for dtype in dtypes:
        jac, rhs, h0 = make_inputs(
            batch, steps, channels, dtype=dtype, device=case.device, with_h0=with_h0
        )
        grad_y = torch.randn(batch, steps, channels, dtype=dtype, device=case.device)
        check_scan_diag((jac, rhs, h0), grad_y, reverse=reverse, backend=case.backend)


def test_first_step_uses_h0(case: Case) -> None:
    jac = torch.tensor([[[0.5, -2.0]]], device=case.device)
    rhs = torch.tensor([[[1.0, 3.0]]], device=case.device)
    h0 = torch.tensor([[4.0, 1.0]], device=case.device)
    for reverse in (False, True):
        y = scan_diag(jac, rhs, h0, reverse=reverse, backend=case.backend)
        assert y.tolist() == [[[3.0, 1.0]]]


# Launch plans that reach every chunk and tile boundary: the chunked single pass and both
# look-back scans (rows per thread from 2 to a whole tile, one group to many; tiles scanned
# across lanes).
PLANS_SMALL: list[dict[str, object]] = [
    {"method": "chunked", "block_t": 8, "block_d": 4},
    {"method": "chunked", "block_t": 16, "block_d": 8},
    {"method": "chunked", "block_t": 8, "block_d": 16},
    # One warp, two channels per thread: whole columns in every thread.
    {"method": "chunked", "block_t": 8, "block_d": 8, "num_warps": 1, "vec": 2},
    # Every tile publishes its inclusive state: the walk is one round trip, window 1 keeps the
    # interpreter's copy of it short.
    {"method": "lookback", "block_t": 8, "rows": 2, "block_d": 4, "window": 1},
    {"method": "lookback", "block_t": 16, "rows": 16, "block_d": 8, "window": 1},
    {"method": "lookback", "block_t": 32, "rows": 4, "block_d": 16},
    {"method": "lookback", "block_t": 8, "rows": 4, "block_d": 8, "num_warps": 2, "vec": 1},
    {"method": "tiles", "block_t": 8, "block_d": 4},
    {"method": "tiles", "block_t": 16, "block_d": 16},
    # Tiles 1-3, 5-7, ... never publish an inclusive state: the walk composes monoids, with the
    # default windows (16 for lookback, 1 for tiles) and windows of 2 and 16 forced.
    {"method": "lookback", "block_t": 8, "rows": 4, "block_d": 4, "inclusive_every": 4},
    {"method": "lookback", "block_t": 4, "rows": 2, "block_d": 8, "inclusive_every": 1000},
    {"method": "tiles", "block_t": 8, "block_d": 4, "inclusive_every": 1000, "window": 16},
    {"method": "tiles", "block_t": 4, "block_d": 8, "inclusive_every": 8, "window": 2},
    # Rescanned tiles (the inputs held while the tile looks back, scanned again from the
    # entering state): one group, several groups with forced walks.
    {"method": "lookback", "block_t": 16, "rows": 16, "block_d": 8, "rescan": True},
    {
        "method": "lookback",
        "block_t": 8,
        "rows": 2,
        "block_d": 4,
        "rescan": True,
        "inclusive_every": 4,
    },
    # Two passes over tiles of several chunks (the last tile partial at most lengths).
    {"method": "twopass", "block_t": 16, "rows": 4, "block_d": 8},
    {"method": "twopass", "block_t": 8, "rows": 2, "block_d": 4, "inclusive_every": 4},
]
PLANS_GPU: list[dict[str, object]] = [
    *PLANS_SMALL,
    {"method": "chunked", "block_t": 64, "block_d": 64},
    {"method": "chunked", "block_t": 64, "block_d": 32, "num_warps": 8},
    {"method": "lookback"},
    {"method": "chunked"},
    {"method": "chunked", "block_t": 8},
    {"method": "lookback", "block_t": 64, "rows": 16, "block_d": 128, "vec": 4},
    {"method": "lookback", "block_t": 256, "rows": 8, "block_d": 64, "num_warps": 8},
    {"method": "lookback", "block_t": 128, "rows": 4, "block_d": 32},
    {"method": "lookback", "block_t": 64, "rows": 64, "block_d": 64, "rescan": True},
    {"method": "lookback", "block_t": 64, "rows": 32, "block_d": 128, "rescan": True},
    {"method": "twopass"},
    {"method": "twopass", "block_t": 256, "rows": 16, "block_d": 128, "num_warps": 2},
    {"method": "tiles"},
    {"method": "tiles", "block_t": 256, "block_d": 64, "num_warps": 8},
    {"method": "tiles", "block_t": 64, "block_d": 32, "num_warps": 2},
]


def _needs_long_input(plan: dict[str, object]) -> bool:
    """Whether the interpreter runs a plan at T = 200 too: plans of tiles of 16 steps or more
    (at most four tiles at T = 63) that do not force a look-back walk. Shorter tiles already
    cross seven or more tile boundaries at T = 63, and forced walks cost most there."""
    block_t = plan["block_t"]
    assert isinstance(block_t, int)
    return block_t >= 16 and "inclusive_every" not in plan


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("steps", [17, 63, 200, 1000])
def test_chunk_and_segment_boundaries(
    case: Case, reverse: bool, steps: int, poisoned: None
) -> None:
    """Small chunks and tiles reach every boundary of both Triton launch shapes."""
    if case.backend != "triton":
        pytest.skip("launch plans belong to the Triton backend")
    if case.small and steps > 200:
        pytest.skip("keeps the interpreter run short")
    batch, channels = (2, 5) if case.small else (2, 45)
    jac, rhs, h0 = make_inputs(
        batch, steps, channels, dtype=torch.float32, device=case.device, with_h0=True
    )
    grad_y = torch.randn_like(rhs)
    ref_y, ref_gj, ref_gr, ref_gh = sequential_with_grads(jac, rhs, h0, grad_y, reverse)
    for plan in PLANS_SMALL if case.small else PLANS_GPU:
        if case.small and steps > 63 and not _needs_long_input(plan):
            continue
        label = " ".join(f"{k}={v}" for k, v in plan.items())
        y = launch.triton_scan_diag(jac, rhs, h0, reverse=reverse, **plan)
        assert_close(y, ref_y, tol=1e-5, name=f"y {label}")
        gj, gr, gh = launch.triton_scan_diag_backward(jac, y, h0, grad_y, reverse=reverse, **plan)
        assert_close(gj, ref_gj, tol=1e-5, name=f"grad jac {label}")
        assert_close(gr, ref_gr, tol=1e-5, name=f"grad rhs {label}")
        assert ref_gh is not None
        assert_close(gh, ref_gh, tol=1e-5, name=f"grad h0 {label}")


FLAG_PLANS: list[dict[str, object]] = [
    {"method": "lookback", "block_t": 8, "rows": 4, "block_d": 4, "inclusive_every": 4},
    {"method": "twopass", "block_t": 8, "rows": 2, "block_d": 4, "inclusive_every": 4},
]


@needs_interpreter
@pytest.mark.parametrize("plan", FLAG_PLANS, ids=lambda plan: str(plan["method"]))
def test_look_back_buffers_are_reused_and_cleared_for_the_next_launch(
    plan: dict[str, object], poisoned: None
) -> None:
    """The look-back and two-pass launches (not the tiles plan's, which takes fresh zeros)
    take their scratch and flags from the stream's buffers: each
    launch clears the flag words the launch before it left set (the ticket counter at least),
    so the buffer the next launch takes is all zeros, through a growth of the flag buffers and
    a scratch too large to keep; every result matches the float64 loop."""
    launch._LOOK_BACK_BUFFERS.clear()
    kept_scratch = []
    with (
        mock.patch.object(launch, "_MIN_FLAG_WORDS", 16),
        mock.patch.object(launch, "_MAX_KEPT_SCRATCH", 256),
    ):
        for steps, channels in ((17, 5), (9, 36), (17, 5)):
            jac, rhs, h0 = make_inputs(
                2, steps, channels, dtype=torch.float32, device="cpu", with_h0=True
            )
            grad_y = torch.randn_like(rhs)
            ref_y, ref_gj, ref_gr, _ = sequential_with_grads(jac, rhs, h0, grad_y, False)
            y = launch.triton_scan_diag(jac, rhs, h0, reverse=False, **plan)
            (buffers,) = launch._LOOK_BACK_BUFFERS.values()
            following = buffers.flags[buffers.turn]
            assert not following.any(), f"next flags {following.tolist()} (T={steps})"
            gj, gr = launch.triton_scan_diag_adjoint(jac, y, h0, grad_y, reverse=False, **plan)
            following = buffers.flags[buffers.turn]
            assert not following.any(), f"next flags {following.tolist()} (T={steps}, adjoint)"
            for name, got, want in (("y", y, ref_y), ("jac", gj, ref_gj), ("rhs", gr, ref_gr)):
                assert_close(got, want, tol=1e-5, name=f"{name} {plan['method']} T={steps}")
            kept_scratch.append(buffers.scratch)
    # 36 channels need more flag words than 16 and more scratch than is kept.
    assert max(words.numel() for words in buffers.flags) > 16
    assert kept_scratch[0] is kept_scratch[1] is kept_scratch[2]


def test_lookback_window_is_checked() -> None:
    for window in (0, 3, -2, 32):
        with pytest.raises(
            ValueError, match=f"window must be a power of two from 1 to 16, got {window}"
        ):
            launch.plan_scan_diag(2, 64, 8, torch.device("cpu"), window=window)
    cpu = torch.device("cpu")
    assert launch.plan_scan_diag(2, 64, 8, cpu, window=1).window == 1
    # Defaults: the tiles kernel walks one tile per round trip, the per-thread-runs kernel's
    # short tiles and the two-pass kernel 16 tiles, the tiles of 32 or 64 steps per thread 4.
    assert launch.plan_scan_diag(2, 64, 200, cpu, method="tiles").window == 1
    assert launch.plan_scan_diag(2, 64, 200, cpu).window == launch.LOOKBACK_WINDOW
    assert launch.plan_scan_diag(2, 64, 200, cpu, dtype=torch.bfloat16).window == 4
    assert launch.plan_scan_diag(2, 64, 16, cpu, dtype=torch.bfloat16).window == 16


@pytest.mark.parametrize(("batch", "channels"), [(3, 48), (2, 200), (64, 1024)])
def test_plan_of_symbolic_sizes_is_the_plan_of_their_values(batch: int, channels: int) -> None:
    """torch.compile with dynamic shapes (and opcheck's dynamic test on the GPU) plans with
    SymInt sizes, which the plan cache cannot hash: such plans are built uncached and equal
    the plan of the sizes' values."""
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    env = ShapeEnv()

    def symbolic(value: int, name: str) -> torch.SymInt:
        symbol = env.create_symbol(value, source=ConstantSource(name))
        return env.create_symintnode(symbol, hint=value)  # type: ignore[return-value]

    cpu = torch.device("cpu")
    sym_b, sym_d = symbolic(batch, "b"), symbolic(channels, "d")
    for dtype in (torch.float32, torch.bfloat16):
        for adjoint in (False, True):
            got = launch.plan_scan_diag(sym_b, 17, sym_d, cpu, dtype=dtype, adjoint=adjoint)  # type: ignore[arg-type]
            want = launch.plan_scan_diag(batch, 17, channels, cpu, dtype=dtype, adjoint=adjoint)
            as_values = {
                name: int(v) if isinstance(v, torch.SymInt) else v for name, v in vars(got).items()
            }
            assert as_values == vars(want)


def test_default_method_follows_channel_blocks_and_storage() -> None:
    """Enough 64-channel blocks for CHUNKED_WAVES programs per multiprocessor (4 for the CPU
    interpreter): the chunked pass, 16-step chunks on aligned channels, 8 otherwise; fewer:
    the two-pass kernel below TWO_PASS_CHANNELS channels, the tiles kernel for 4-byte storage
    with FEW_CHANNELS channels or more, the per-thread-runs kernel otherwise."""
    cpu = torch.device("cpu")
    enough = launch.CHUNKED_WAVES * multiprocessor_count(cpu)
    aligned = launch.ALIGNED_CHANNELS
    few = launch.FEW_CHANNELS
    assert few > 64 * enough  # the CPU's chunked threshold comes first
    fp32, bf16 = torch.float32, torch.bfloat16
    for batch, channels, dtype, method, block_t in [
        (enough, 64, fp32, "chunked", 16),
        (enough, 64, bf16, "chunked", 16),
        (1, 64 * enough, bf16, "chunked", 16),
        (enough, 50, fp32, "chunked", 8),
        (enough, aligned * 4 + 8, bf16, "chunked", 8),
        (enough - 1, 64, fp32, "lookback", 32),
        (enough - 1, 64, bf16, "lookback", 64),
        (1, 64 * (enough - 1), fp32, "lookback", 32),
        (3, 100, bf16, "lookback", 64),
        (3, 100, fp32, "lookback", 32),
        (3, 50, bf16, "twopass", 512),
        (1, 255, fp32, "twopass", 512),
    ]:
        plan = launch.plan_scan_diag(batch, 1000, channels, cpu, dtype=dtype)
        assert (plan.method, plan.block_t) == (method, block_t), (batch, channels, plan)
    # An explicit method wins.
    assert launch.plan_scan_diag(enough, 1000, 64, cpu, method="tiles").method == "tiles"
    with pytest.raises(
        ValueError, match="vec must be a power of two from 1 to block_d = 64, got 3"
    ):
        launch.plan_scan_diag(enough, 1000, 64, cpu, vec=3)
    # Look-back tiles are whole runs: powers of two (a larger run sets the tile's length).
    for method in ("lookback", "twopass"):
        with pytest.raises(ValueError, match="block_t must be a power of two, got 100"):
            launch.plan_scan_diag(1, 1000, 64, cpu, method=method, block_t=100, rows=4)
        with pytest.raises(ValueError, match="rows must be a power of two, got 6"):
            launch.plan_scan_diag(1, 1000, 64, cpu, method=method, block_t=64, rows=6)
        assert (
            launch.plan_scan_diag(1, 1000, 64, cpu, method=method, block_t=8, rows=16).block_t == 16
        )


def test_look_back_tiles_follow_storage_direction_and_channels() -> None:
    """With too few channel blocks for the chunked pass (a device of many multiprocessors):
    fp32 with FEW_CHANNELS channels or more takes the tiles kernel, with fewer the short
    look-back tiles; bf16 takes the rescanned 64-step tiles except for its adjoint with many
    channels, which (as fp16 always) takes the 32 x 128 tiles; below TWO_PASS_CHANNELS every
    storage takes the two-pass kernel."""
    cpu = torch.device("cpu")
    few = launch.FEW_CHANNELS

    def plan(batch: int, channels: int, dtype: torch.dtype, adjoint: bool) -> tuple[object, ...]:
        with pytest.MonkeyPatch.context() as m:
            m.setattr(launch, "multiprocessor_count", lambda device: 10**6)
            p = launch.plan_scan_diag(batch, 4096, channels, cpu, dtype=dtype, adjoint=adjoint)
        return (p.method, p.block_t, p.rows, p.block_d, p.num_warps, p.window, p.rescan)

    tiles = ("tiles", 64, 1, 64, 4, 1, False)
    short = ("lookback", 32, 16, 64, 2, launch.LOOKBACK_WINDOW, False)
    wide = ("lookback", 32, 32, 128, 2, 4, False)
    rescan = ("lookback", 64, 64, 64, 1, 4, True)
    for adjoint in (False, True):
        assert plan(few // 512, 512, torch.float32, adjoint) == tiles
        assert plan(few // 512 - 1, 512, torch.float32, adjoint) == short
        assert plan(1, 256, torch.bfloat16, adjoint) == rescan
        assert plan(few // 512, 512, torch.float16, adjoint) == wide
    assert plan(few // 512, 512, torch.bfloat16, False) == rescan
    assert plan(few // 512, 512, torch.bfloat16, True) == wide
    # Fewer channels than a tile: the tile narrows, and so do its warps.
    assert plan(8, 48, torch.float16, False)[3:5] == (64, 1)
    # Very few channels: two passes over long tiles, whatever the storage and direction.
    twopass = ("twopass", 512, 8, 64, 1, launch.LOOKBACK_WINDOW, False)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for adjoint in (False, True):
            assert plan(2, launch.TWO_PASS_CHANNELS // 2 - 1, dtype, adjoint) == twopass
    # Rows follow a shorter forced tile; an explicit rescan wins.
    bf16 = torch.bfloat16
    with_rows = launch.plan_scan_diag(1, 99, 8, cpu, dtype=bf16, method="lookback", block_t=16)
    assert (with_rows.block_t, with_rows.rows) == (16, 16)
    assert not launch.plan_scan_diag(
        1, 99, 8, cpu, dtype=bf16, method="lookback", rescan=False
    ).rescan


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_low_precision_storage(
    case: Case, dtype: torch.dtype, reverse: bool, poisoned: None
) -> None:
    batch, channels = sizes(case)
    steps = 63 if case.small else 1000
    jac, rhs, h0 = make_inputs(
        batch, steps, channels, dtype=dtype, device=case.device, with_h0=True
    )
    grad_y = torch.randn(batch, steps, channels, device=case.device).to(dtype)
    check_scan_diag((jac, rhs, h0), grad_y, reverse=reverse, backend=case.backend)


# 2-byte tiles of the look-back kernels at interpreter sizes: rescanned runs (bf16 widens by its
# bit pattern in the first pass, fp16 by conversion), the wide tile, two passes.
PLANS_LOW_PRECISION: list[dict[str, object]] = [
    {"method": "lookback", "block_t": 16, "rows": 16, "block_d": 8, "rescan": True},
    {"method": "lookback", "block_t": 8, "rows": 4, "block_d": 4, "rescan": True,
     "inclusive_every": 2},
    {"method": "lookback", "block_t": 8, "rows": 8, "block_d": 8},
    {"method": "twopass", "block_t": 16, "rows": 4, "block_d": 8},
]  # fmt: skip


@needs_interpreter
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("steps", [1, 17, 63])
def test_low_precision_look_back_tiles(
    dtype: torch.dtype, reverse: bool, steps: int, poisoned: None
) -> None:
    """Every 2-byte look-back tile against the float64 loop, forward and every gradient."""
    jac, rhs, h0 = make_inputs(2, steps, 5, dtype=dtype, device="cpu", with_h0=True)
    grad_y = torch.randn(2, steps, 5).to(dtype)
    ref_y, ref_gj, ref_gr, ref_gh = sequential_with_grads(jac, rhs, h0, grad_y, reverse)
    assert ref_gh is not None
    for plan in PLANS_LOW_PRECISION:
        label = f"{dtype} " + " ".join(f"{k}={v}" for k, v in plan.items())
        y = launch.triton_scan_diag(jac, rhs, h0, reverse=reverse, **plan)
        assert y.dtype == dtype
        assert_close(y, ref_y, tol=FORWARD_TOL[dtype], name=f"y {label}")
        gj, gr, gh = launch.triton_scan_diag_backward(jac, y, h0, grad_y, reverse=reverse, **plan)
        assert_close(gj, ref_gj, tol=GRAD_TOL[dtype], name=f"grad jac {label}")
        assert_close(gr, ref_gr, tol=GRAD_TOL[dtype], name=f"grad rhs {label}")
        assert_close(gh, ref_gh, tol=GRAD_TOL[dtype], name=f"grad h0 {label}")


# The streamed pass (chunks moved by TMA) at interpreter sizes: several chunks and channel
# blocks (the last one partial), one stage and several; and its default plan.
PLANS_STREAMED: list[dict[str, object]] = [
    {"method": "streamed", "block_t": 8, "block_d": 16, "stages": 2},
    {"method": "streamed", "block_t": 16, "block_d": 8, "stages": 1},
    {"method": "streamed"},
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("with_h0", [False, True], ids=["zero-h0", "h0"])
def test_streamed_pass_matches_the_loop(
    case: Case, dtype: torch.dtype, reverse: bool, with_h0: bool, poisoned: None
) -> None:
    """The streamed pass against the float64 loop, forward and every gradient: chunk edges
    (T = 1, 17, 63; 4097 on the GPU), a partial channel block, both directions."""
    if case.backend != "triton":
        pytest.skip("launch plans belong to the Triton backend")
    if case.device == "cuda" and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the streamed pass needs compute capability >= 9.0")
    batch, channels = (2, 24) if case.small else (3, 200)
    for steps in [1, 17, 63] if case.small else [1, 17, 1000, 4097]:
        jac, rhs, h0 = make_inputs(
            batch, steps, channels, dtype=dtype, device=case.device, with_h0=with_h0
        )
        grad_y = torch.randn(batch, steps, channels, device=case.device).to(dtype)
        ref_y, ref_gj, ref_gr, ref_gh = sequential_with_grads(jac, rhs, h0, grad_y, reverse)
        for plan in PLANS_STREAMED:
            label = f"{dtype} T={steps} " + " ".join(f"{k}={v}" for k, v in plan.items())
            y = launch.triton_scan_diag(jac, rhs, h0, reverse=reverse, **plan)
            assert y.dtype == dtype
            assert_close(y, ref_y, tol=FORWARD_TOL[dtype], name=f"y {label}")
            gj, gr, gh = launch.triton_scan_diag_backward(
                jac, y, h0, grad_y, reverse=reverse, **plan
            )
            assert_close(gj, ref_gj, tol=GRAD_TOL[dtype], name=f"grad jac {label}")
            assert_close(gr, ref_gr, tol=GRAD_TOL[dtype], name=f"grad rhs {label}")
            if ref_gh is not None:
                assert_close(gh, ref_gh, tol=GRAD_TOL[dtype], name=f"grad h0 {label}")


def test_streamed_pass_needs_aligned_rows() -> None:
    """TMA needs every row to start 16-byte aligned: 5 fp32 channels are 20 bytes a row."""
    cpu = torch.device("cpu")
    with pytest.raises(ValueError, match="channels = 5"):
        launch.plan_scan_diag(2, 64, 5, cpu, method="streamed")
    plan = launch.plan_scan_diag(2, 64, 24, cpu, dtype=torch.bfloat16, method="streamed")
    assert (plan.method, plan.block_t, plan.block_d, plan.stages) == ("streamed", 64, 32, 4)
    # A TMA box is at least 16 bytes along the channels: 8 bf16 channels, 4 fp32 ones.
    with pytest.raises(
        ValueError, match=r"at least 16 bytes \(8 channels of torch.bfloat16\), got 4"
    ):
        launch.plan_scan_diag(2, 64, 24, cpu, dtype=torch.bfloat16, method="streamed", block_d=4)
    with pytest.raises(ValueError, match="stages must be >= 1"):
        launch.plan_scan_diag(2, 64, 12, cpu, method="streamed", stages=-1)


def test_streamed_pass_streams_forward_passes_only() -> None:
    """The adjoint of a streamed call is its shape's default adjoint plan, tile arguments and
    all (the streamed adjoint was slower at every shape swept): for a shape the streamed pass
    could not take, too."""
    cpu = torch.device("cpu")
    for dtype, channels in [(torch.bfloat16, 1536), (torch.float32, 512), (torch.float32, 5)]:
        default = launch.plan_scan_diag(8, 4096, channels, cpu, dtype=dtype, adjoint=True)
        streamed = launch.plan_scan_diag(
            8, 4096, channels, cpu, dtype=dtype, adjoint=True, method="streamed", block_t=32,
            block_d=16, stages=8,
        )  # fmt: skip
        assert streamed == default, (dtype, channels)
        assert default.method != "streamed"


@needs_interpreter
def test_streamed_pass_takes_the_default_plan_at_misaligned_addresses(poisoned: None) -> None:
    """A tensor whose storage starts 4 bytes past a 16-byte boundary cannot be described to the
    TMA: the streamed plan runs the default plan instead (the adjoint takes it anyway), with
    the same results."""
    batch, steps, channels = 2, 17, 12
    jac, rhs, h0 = make_inputs(
        batch, steps, channels, dtype=torch.float32, device="cpu", with_h0=True
    )
    assert h0 is not None
    shifted = torch.empty(jac.numel() + 1)[1:].view_as(jac).copy_(jac)
    assert shifted.data_ptr() % 16 != 0
    cpu = torch.device("cpu")
    launched: list[launch.DiagScanPlan] = []

    def record(name: str) -> Any:
        original = getattr(launch, name)

        def launcher(*args: Any, **kwargs: Any) -> None:
            launched.append(args[4])
            original(*args, **kwargs)

        return mock.patch.object(launch, name, launcher)

    with record("_launch_diag_chunked"), record("_launch_diag_lookback"):
        y = launch.triton_scan_diag(shifted, rhs, h0, reverse=False, method="streamed")
        grad_y = torch.randn_like(y)
        grad_jac, grad_rhs, _ = launch.triton_scan_diag_backward(
            shifted, y, h0, grad_y, reverse=False, method="streamed"
        )
    assert launched == [
        launch.plan_scan_diag(batch, steps, channels, cpu),
        launch.plan_scan_diag(batch, steps, channels, cpu, adjoint=True),
    ]
    ref_y = reference_scan_diag(jac.double(), rhs.double(), h0.double())
    ref_gj, ref_gr, _ = reference_scan_diag_backward(
        jac.double(), ref_y, h0.double(), grad_y.double(), reverse=False
    )
    assert_close(y, ref_y, tol=FORWARD_TOL[torch.float32], name="y")
    assert_close(grad_jac, ref_gj, tol=GRAD_TOL[torch.float32], name="grad jac")
    assert_close(grad_rhs, ref_gr, tol=GRAD_TOL[torch.float32], name="grad rhs")


def test_streamed_pass_is_the_default_only_in_its_window() -> None:
    """By default only bf16 forward passes that would take the look-back tiles stream: on
    compute capability >= 9.0, with 16-byte rows, at most STREAMED_MAX_STEPS steps and 32-channel
    programs 2.5 to 3.5 times the multiprocessors (the H100 sweep's window)."""
    cpu = torch.device("cpu")
    bf16 = torch.bfloat16

    def method(
        batch: int, steps: int, channels: int, dtype: torch.dtype = bf16, adjoint: bool = False
    ) -> str:
        plan = launch.plan_scan_diag(batch, steps, channels, cpu, dtype=dtype, adjoint=adjoint)
        return plan.method

    with (
        mock.patch.object(launch, "device_capability", return_value=(9, 0)),
        mock.patch.object(launch, "multiprocessor_count", return_value=132),
    ):
        assert method(8, 4096, 1536) == "streamed"  # 384 programs
        assert method(12, 1024, 1024) == "streamed"
        assert method(8, launch.STREAMED_MAX_STEPS, 1536) == "streamed"
        assert method(8, launch.STREAMED_MAX_STEPS + 1, 1536) == "lookback"
        assert method(8, 4096, 1536, adjoint=True) == "lookback"
        assert method(8, 4096, 1536, dtype=torch.float16) == "lookback"
        assert method(8, 4096, 1536, dtype=torch.float32) == "tiles"
        assert method(4, 4096, 1536) == "lookback"  # 192 programs: too few
        assert method(32, 4096, 512) == "lookback"  # 512 programs: too many
        assert method(8, 4096, 1532) == "lookback"  # rows of 3064 bytes
        assert method(64, 4096, 1536) == "chunked"
        # The window's edges on 132 multiprocessors: 330 <= programs < 462.
        assert method(11, 4096, 960) == "streamed"  # 330 programs
        assert method(7, 4096, 1504) == "lookback"  # 329
        assert method(1, 4096, 14752) == "streamed"  # 461
        assert method(1, 4096, 14784) == "lookback"  # 462
    with (
        mock.patch.object(launch, "device_capability", return_value=(8, 0)),
        mock.patch.object(launch, "multiprocessor_count", return_value=132),
    ):
        assert method(8, 4096, 1536) == "lookback"  # no TMA
    # The interpreter (four multiprocessors, no compute capability) streams only when asked:
    # 12 programs would be in its window.
    assert method(6, 4096, 64) == "lookback"


def test_streamed_pass_needs_the_tma() -> None:
    """Asked for on a card without the TMA (compute capability < 9.0), the streamed pass is a
    clear error."""
    with pytest.raises(
        ValueError, match=r"compute capability >= 9\.0.*has compute capability 8\.0"
    ):
        launch._build_plan(
            4, 96, 108, (8, 0), torch.bfloat16, False, "streamed", False, None, None, None,
            None, 1, None, None, None, None,
        )  # fmt: skip


@needs_interpreter
def test_default_streamed_pass_runs_and_falls_back(poisoned: None) -> None:
    """A default streamed plan (a Hopper card's window, mocked onto the interpreter's four
    multiprocessors: 12 programs) gives the loop's results, and at a misaligned address the
    shape's plan without the streamed pass runs instead (not the streamed plan again)."""
    batch, steps, channels = 6, 70, 64
    bf16 = torch.bfloat16
    cpu = torch.device("cpu")
    jac, rhs, h0 = make_inputs(batch, steps, channels, dtype=bf16, device="cpu", with_h0=True)
    assert h0 is not None
    ref_y = reference_scan_diag(jac.double(), rhs.double(), h0.double())
    shifted = torch.empty(jac.numel() + 1, dtype=bf16)[1:].view_as(jac).copy_(jac)
    assert shifted.data_ptr() % 16 != 0
    launched: list[str] = []
    original = launch._launcher

    def launcher(plan: launch.DiagScanPlan) -> Any:
        launched.append(plan.method)
        return original(plan)

    with (
        mock.patch.object(launch, "device_capability", return_value=(9, 0)),
        mock.patch.object(launch, "multiprocessor_count", return_value=4),
        mock.patch.object(launch, "_launcher", launcher),
    ):
        assert launch.plan_scan_diag(batch, steps, channels, cpu, dtype=bf16).method == "streamed"
        y = launch.triton_scan_diag(jac, rhs, h0, reverse=False)
        y_shifted = launch.triton_scan_diag(shifted, rhs, h0, reverse=False)
    assert launched == ["streamed", "streamed", "lookback"]
    assert_close(y, ref_y, tol=FORWARD_TOL[bf16], name="y streamed")
    assert_close(y_shifted, ref_y, tol=FORWARD_TOL[bf16], name="y misaligned")


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_default_streamed_plan_on_gpu_matches_sequential(reverse: bool, poisoned: None) -> None:
    """The default plan's streamed window on this GPU (bf16, about three 32-channel programs per
    multiprocessor): the public op against the float64 loop, its forward streamed and every
    gradient by the default adjoint, at a chunk edge and one step past it."""
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the streamed pass needs compute capability >= 9.0")
    bf16, dev, channels = torch.bfloat16, torch.device("cuda"), 1536
    batch = -(-3 * multiprocessor_count(dev) // (channels // 32))
    for steps in (4096, 4097):
        plan = launch.plan_scan_diag(batch, steps, channels, dev, dtype=bf16)
        assert plan.method == "streamed", plan
        jac, rhs, h0 = make_inputs(batch, steps, channels, dtype=bf16, device="cuda", with_h0=True)
        grad_y = torch.randn(batch, steps, channels, device="cuda").to(bf16)
        check_scan_diag((jac, rhs, h0), grad_y, reverse=reverse, backend="triton")


def test_noncontiguous_inputs_and_expanded_gradients(case: Case, poisoned: None) -> None:
    batch, channels = sizes(case)
    steps = 17
    # Inputs laid out [B, D, T] and viewed as [B, T, D]: strided, not contiguous.
    jac = (0.9 * torch.rand(batch, channels, steps, device=case.device)).transpose(1, 2)
    rhs = torch.randn(batch, channels, steps, device=case.device).transpose(1, 2)
    h0 = torch.randn(channels, batch, device=case.device).t()
    assert not jac.is_contiguous() and not rhs.is_contiguous() and not h0.is_contiguous()
    leaves = [t.detach().clone().requires_grad_() for t in (jac, rhs, h0)]
    # Cloning keeps the strides; sum() hands backward an expanded (stride-0) gradient.
    assert not leaves[0].is_contiguous()
    scan_diag(leaves[0], leaves[1], leaves[2], backend=case.backend).sum().backward()
    grad_y = torch.ones(batch, steps, channels, device=case.device)
    ref_y, ref_gj, ref_gr, ref_gh = sequential_with_grads(jac, rhs, h0, grad_y, False)
    y = scan_diag(jac, rhs, h0, backend=case.backend)
    assert_close(y, ref_y, tol=1e-5, name="y")
    assert_close(leaves[0].grad, ref_gj, tol=1e-5, name="grad jac")
    assert_close(leaves[1].grad, ref_gr, tol=1e-5, name="grad rhs")
    assert ref_gh is not None
    assert_close(leaves[2].grad, ref_gh, tol=1e-5, name="grad h0")


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_h0_without_gradient_and_inputs_without_any(
    case: Case, reverse: bool, poisoned: None
) -> None:
    """An h0 that needs no gradient gets none (the Triton backward then skips its adjoint), and
    inputs that need none give states without a graph (no autograd function at all)."""
    batch, channels = sizes(case)
    jac, rhs, h0 = make_inputs(batch, 17, channels, dtype=torch.float32, device=case.device,
                               with_h0=True)  # fmt: skip
    assert h0 is not None
    grad_y = torch.randn_like(rhs)
    ref_y, ref_gj, ref_gr, _ = sequential_with_grads(jac, rhs, h0, grad_y, reverse)
    plain = scan_diag(jac, rhs, h0, reverse=reverse, backend=case.backend)
    assert plain.grad_fn is None and not plain.requires_grad
    assert_close(plain, ref_y, tol=1e-5, name="y without grad")
    leaves = [t.clone().requires_grad_() for t in (jac, rhs)]
    y = scan_diag(leaves[0], leaves[1], h0, reverse=reverse, backend=case.backend)
    y.backward(grad_y)
    assert h0.grad is None
    assert_close(y, ref_y, tol=1e-5, name="y")
    assert_close(leaves[0].grad, ref_gj, tol=1e-5, name="grad jac")
    assert_close(leaves[1].grad, ref_gr, tol=1e-5, name="grad rhs")


def test_gradcheck_float64() -> None:
    jac, rhs, h0 = make_inputs(2, 9, 3, dtype=torch.float64, device="cpu", with_h0=True)
    assert h0 is not None
    for reverse in (False, True):
        inputs = tuple(t.clone().requires_grad_() for t in (jac, rhs, h0))
        assert torch.autograd.gradcheck(
            lambda j, r, h, reverse=reverse: scan_diag(j, r, h, reverse=reverse, backend="eager"),
            inputs,
        )


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize(
    ("batch", "steps", "channels", "dtype"),
    [
        *(
            (*shape, torch.float32)
            for shape in [(1, 2**20, 3), (2, 2**16, 300), (8, 4096, 256), (1, 65537, 64)]
        ),
        (64, 2048, 1024, torch.float32),
        # bf16's rescanned tiles (forward; adjoint with few channels) and its wide adjoint tiles.
        (1, 2**20, 3, torch.bfloat16),
        (2, 2**16, 300, torch.bfloat16),
        (8, 4096, 1536, torch.bfloat16),
    ],
)
def test_long_sequences_on_gpu(
    batch: int, steps: int, channels: int, dtype: torch.dtype, poisoned: None
) -> None:
    """Default launch plans (single pass and multi-block along T) up to T = 2^20."""
    jac, rhs, h0 = make_inputs(batch, steps, channels, dtype=dtype, device="cuda", with_h0=True)
    grad_y = torch.randn_like(rhs)
    forward_tol, grad_tol = FORWARD_TOL[dtype], GRAD_TOL[dtype]
    for reverse in (False, True):
        # The float64 log-depth reference, itself checked against the loop at T <= 1000 above.
        ref_y = reference_scan_diag(
            jac.double(), rhs.double(), h0.double() if h0 is not None else None, reverse=reverse
        )
        leaves = [t.clone().requires_grad_() for t in (jac, rhs)]
        y = scan_diag(leaves[0], leaves[1], h0, reverse=reverse, backend="triton")
        assert_close(y, ref_y, tol=forward_tol, name=f"y T={steps}")
        y.backward(grad_y)
        ref_gj, ref_gr, _ = reference_scan_diag_backward(
            jac.double(),
            ref_y,
            h0.double() if h0 is not None else None,
            grad_y.double(),
            reverse=reverse,
        )
        assert_close(leaves[0].grad, ref_gj, tol=grad_tol, name=f"grad jac T={steps}")
        assert_close(leaves[1].grad, ref_gr, tol=grad_tol, name=f"grad rhs T={steps}")


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("method", ["chunked", "lookback", "tiles", "twopass", "streamed"])
def test_gpu_results_are_bitwise_repeatable(method: str) -> None:
    """The look-back scan's tiles race to publish: any ordering bug shows as a moving result."""
    if method == "streamed" and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the streamed pass needs compute capability >= 9.0")
    jac, rhs, h0 = make_inputs(2, 2**17 + 3, 96, dtype=torch.float32, device="cuda", with_h0=True)
    grad_y = torch.randn_like(rhs)
    first = launch.triton_scan_diag(jac, rhs, h0, reverse=False, method=method)
    first_grads = launch.triton_scan_diag_backward(
        jac, first, h0, grad_y, reverse=False, method=method
    )
    for _ in range(20):
        again = launch.triton_scan_diag(jac, rhs, h0, reverse=False, method=method)
        assert torch.equal(again, first)
        grads = launch.triton_scan_diag_backward(
            jac, first, h0, grad_y, reverse=False, method=method
        )
        for got, want in zip(grads, first_grads, strict=True):
            assert torch.equal(got, want)


@needs_interpreter
@pytest.mark.parametrize("method", ["chunked", "lookback", "tiles", "twopass"])
def test_eager_scan_launches_bypass_the_wrap_triton_op(
    method: str,
    poisoned: None,
    refused_wrapper_launches: list[object],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As the fused launches: eager scans launch the kernel itself (the higher-order op's
    dispatch costs host time at every call), traced ones go through ``wrap_triton``."""
    jac, rhs, h0 = make_inputs(2, 19, 5, dtype=torch.float32, device="cpu", with_h0=True)
    plan = {"method": method, "block_t": 8, "block_d": 4}
    y = launch.triton_scan_diag(jac, rhs, h0, reverse=False, **plan)
    assert_close(y, sequential_scan_diag(jac, rhs, h0), tol=1e-5, name="y")
    launch.triton_scan_diag_backward(jac, y, h0, torch.ones_like(y), reverse=False, **plan)
    assert len(refused_wrapper_launches) == 2  # each launch still asked wrap_triton
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    with pytest.raises(AssertionError, match="through the wrap_triton wrapper"):
        launch.triton_scan_diag(jac, rhs, h0, reverse=False, **plan)


def test_launches_go_through_wrap_triton_under_any_dispatch_mode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Fake tensors (opcheck, torch.compile's tracing) cannot be launched on: any active
    dispatch mode keeps the wrapper (and ``scan_diag`` the registered op)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from pararnn_kernels._launch import launchable, plain_eager

    class _Wrapper:
        def __init__(self, kernel: object) -> None:
            self.kernel = kernel

    kernel = object()
    monkeypatch.setattr(torch.library, "wrap_triton", _Wrapper)
    assert plain_eager()
    assert launchable(kernel) is kernel
    with FakeTensorMode():
        assert not plain_eager()
        assert isinstance(launchable(kernel), _Wrapper)


@needs_interpreter
def test_eager_triton_scan_refuses_a_second_derivative(poisoned: None) -> None:
    """The adjoint kernels build no graph: differentiating them again is an error, not zeros."""
    jac, rhs, _ = make_inputs(1, 9, 3, dtype=torch.float32, device="cpu", with_h0=False)
    rhs.requires_grad_()
    y = scan_diag(jac, rhs, backend="triton")
    (grad_rhs,) = torch.autograd.grad(y.square().sum(), rhs, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        grad_rhs.sum().backward()
