"""Context parallel along time: 2 gloo ranks (CI) and the same checks on 2 GPUs with NCCL."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch

import pararnn_core as pc
from pararnn_dist import ContextParallelScan, scan_diag_context_parallel, time_shard_bounds
from pararnn_dist.context_parallel import _exclusive_carry, _TileAlgebra
from pararnn_kernels import scan_block_diag, scan_diag

Results = dict[int, dict[str, str]]
WORKER = "cp_worker.py"

CHECKS = [
    "tiles_equal_full_scan",
    "tile_gradients_equal_full_scan",
    "block_tiles_equal_full_scan",
    "block_tile_gradients_equal_full_scan",
    "backend_equals_kernel_scan",
    "newton_context_parallel_equals_eager",
    "newton_lstm_context_parallel_equals_eager",
    "newton_slstm_context_parallel_equals_eager",
    "one_collective_each_way",
    "bad_inputs_raise_on_every_rank",
]


@pytest.mark.parametrize("check", CHECKS)
def test_worker_check(harness: Any, worker_results: Results, check: str) -> None:
    """One named check of the worker group (gloo on CPU; NCCL, marked cuda, on 2 GPUs)."""
    harness.assert_check(worker_results, check)


@pytest.mark.parametrize(
    ("steps", "world"), [(2, 2), (8, 2), (17, 2), (64, 2), (10, 4), (7, 7), (5, 1), (100, 3)]
)
def test_time_shard_bounds_cover_and_balance(steps: int, world: int) -> None:
    bounds = [time_shard_bounds(steps, r, world) for r in range(world)]
    assert bounds[0][0] == 0
    assert bounds[-1][1] == steps
    for (_, end), (start, _) in itertools.pairwise(bounds):
        assert end == start
    lengths = [e - s for s, e in bounds]
    assert min(lengths) >= 1
    assert max(lengths) - min(lengths) <= 1
    assert lengths == sorted(lengths, reverse=True)  # the remainder goes to the first ranks


def test_time_shard_bounds_errors() -> None:
    with pytest.raises(ValueError, match=r"T = 1 time steps cannot be split over world = 2"):
        time_shard_bounds(1, 0, 2)
    with pytest.raises(ValueError, match=r"rank must be in \[0, world\) = \[0, 2\), got 2"):
        time_shard_bounds(4, 2, 2)
    with pytest.raises(ValueError, match="world must be >= 1, got 0"):
        time_shard_bounds(4, 0, 0)
    with pytest.raises(TypeError, match="T must be an int"):
        time_shard_bounds(4.0, 0, 2)  # type: ignore[arg-type]


@pytest.mark.parametrize("block", [False, True], ids=["diag", "block3"])
@pytest.mark.parametrize("world", [4, 5])
def test_tile_algebra_stitches_many_virtual_ranks(block: bool, world: int) -> None:
    """The per-tile pieces of the protocol without a process group, for more tiles than the
    2-rank worker has: local scan from zero, tile product, exclusive carry, correction. With
    non-commuting blocks, a product or carry composed in the wrong order fails here."""
    steps, k = 23, 3
    gen = torch.Generator().manual_seed(world)
    if block:
        raw = torch.randn(2, steps, 3, k, k, generator=gen, dtype=torch.float64)
        jac = 0.9 * raw / torch.linalg.matrix_norm(raw, ord=2).clamp(min=1.0)[..., None, None]
        rhs = torch.randn(2, steps, 3, k, generator=gen, dtype=torch.float64)
        h0 = torch.randn(2, 3, k, generator=gen, dtype=torch.float64)
        want = scan_block_diag(jac, rhs, h0, backend="eager")
    else:
        jac = 0.5 + 0.5 * torch.rand(2, steps, 3, generator=gen, dtype=torch.float64)
        rhs = torch.randn(2, steps, 3, generator=gen, dtype=torch.float64)
        h0 = torch.randn(2, 3, generator=gen, dtype=torch.float64)
        want = scan_diag(jac, rhs, h0, backend="eager")
    algebra = _TileAlgebra(block, "eager")
    tiles = []
    for r in range(world):
        start, end = time_shard_bounds(steps, r, world)
        a, b = jac[:, start:end], rhs[:, start:end]
        tiles.append((a, b, *algebra.local(a, b)))
    got = []
    for r, (a, b, z, _p_end, prod) in enumerate(tiles):
        carry = _exclusive_carry(algebra, [(t[3], t[2][:, -1]) for t in tiles[:r]], h0)
        got.append(algebra.correct(a, b, z, prod, carry))
        if r > 0:  # the carry is the previous tile's exact last state
            torch.testing.assert_close(carry, got[r - 1][:, -1], atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(torch.cat(got, dim=1), want, atol=1e-12, rtol=1e-12)


def test_needs_an_initialised_group() -> None:
    x = torch.zeros(1, 2, 1)
    with pytest.raises(RuntimeError, match="init_process_group"):
        scan_diag_context_parallel(x, x)
    with pytest.raises(RuntimeError, match="init_process_group"):
        ContextParallelScan()(x, x, None, reverse=False, structure=pc.Diag())


def test_entry_point_provides_the_backend() -> None:
    assert "context_parallel" in pc.known_scan_backends()
    assert isinstance(pc.get_scan_backend("context_parallel"), ContextParallelScan)
    pc.NewtonConfig(scan_backend="context_parallel")  # accepted once pararnn-dist is installed


@pytest.mark.cuda
def test_two_ranks_on_two_streams() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from pararnn_dist import scan_diag_two_ranks
    from pararnn_kernels import sequential_scan_diag

    gen = torch.Generator().manual_seed(0)
    for steps in (2, 17, 64):
        jac = (0.5 + 0.5 * torch.rand(2, steps, 3, generator=gen)).cuda()
        rhs = torch.randn(2, steps, 3, generator=gen).cuda()
        h0 = torch.randn(2, 3, generator=gen).cuda()
        got = scan_diag_two_ranks(jac, rhs, h0)
        want = sequential_scan_diag(jac.double(), rhs.double(), h0.double())
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
