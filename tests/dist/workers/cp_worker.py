"""Context-parallel checks on 2 ranks (launched by tests/dist/test_context_parallel.py)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from _common import Checks, Mismatches, check_close, expect_error, init
from torch import Tensor

import pararnn_core as pc
from pararnn_dist import (
    ContextParallelScan,
    scan_block_diag_context_parallel,
    scan_diag_context_parallel,
    time_shard_bounds,
)
from pararnn_kernels import scan_block_diag, sequential_scan_diag

RANK, WORLD, DEVICE = init()
checks = Checks()
B, D = 2, 3


def problem(steps: int, dtype: torch.dtype, seed: int) -> tuple[Tensor, Tensor, Tensor]:
    """The same full (jac, rhs, h0) on every rank; |jac| in [0.5, 1) keeps carries non-trivial."""
    gen = torch.Generator().manual_seed(seed)
    sign = torch.where(torch.rand(B, steps, D, generator=gen) < 0.2, -1.0, 1.0)
    jac = sign * (0.5 + 0.5 * torch.rand(B, steps, D, generator=gen))
    rhs = torch.randn(B, steps, D, generator=gen)
    h0 = torch.randn(B, D, generator=gen)
    return (t.to(DEVICE, torch.float64).to(dtype) for t in (jac, rhs, h0))  # type: ignore[return-value]


def block_problem(
    steps: int, k: int, dtype: torch.dtype, seed: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Full block (jac [B, T, D, k, k], rhs, h0), the same on every rank. The blocks are neither
    symmetric nor commuting (so a transposed or reordered product is wrong) and have norm < 1."""
    gen = torch.Generator().manual_seed(seed)
    raw = torch.randn(B, steps, D, k, k, generator=gen, dtype=torch.float64)
    jac = 0.9 * raw / torch.linalg.matrix_norm(raw, ord=2).clamp(min=1.0)[..., None, None]
    rhs = torch.randn(B, steps, D, k, generator=gen, dtype=torch.float64)
    h0 = torch.randn(B, D, k, generator=gen, dtype=torch.float64)
    return (t.to(DEVICE).to(dtype) for t in (jac, rhs, h0))  # type: ignore[return-value]


@checks.add
def tiles_equal_full_scan() -> None:
    for steps in (2, 8, 17, 64):
        for reverse in (False, True):
            for with_h0 in (False, True):
                jac, rhs, h0 = problem(steps, torch.float64, seed=steps)
                ref = sequential_scan_diag(jac, rhs, h0 if with_h0 else None, reverse=reverse)
                start, end = time_shard_bounds(steps, RANK, WORLD)
                what = f"T={steps} reverse={reverse} h0={with_h0}"
                for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-5)):
                    y = scan_diag_context_parallel(
                        jac[:, start:end].to(dtype),
                        rhs[:, start:end].to(dtype),
                        h0.to(dtype) if with_h0 else None,
                        reverse=reverse,
                    )
                    assert y.dtype == dtype
                    check_close(y, ref[:, start:end], atol=tol, rtol=tol, what=f"{what} {dtype}")


@checks.add
def tile_gradients_equal_full_scan() -> None:
    for steps in (2, 17):
        for reverse in (False, True):
            jac, rhs, h0 = problem(steps, torch.float64, seed=100 + steps)
            weight = torch.randn(jac.shape, generator=torch.Generator().manual_seed(7)).to(jac)
            full = [t.clone().requires_grad_(True) for t in (jac, rhs, h0)]
            ref = sequential_scan_diag(*full, reverse=reverse)
            (ref * weight).sum().backward()
            start, end = time_shard_bounds(steps, RANK, WORLD)
            tile = [jac[:, start:end].clone(), rhs[:, start:end].clone(), h0.clone()]
            for t in tile:
                t.requires_grad_(True)
            y = scan_diag_context_parallel(*tile, reverse=reverse)
            (y * weight[:, start:end]).sum().backward()
            what = f"T={steps} reverse={reverse}"
            for name, got, want in zip(("jac", "rhs"), tile[:2], full[:2], strict=True):
                assert got.grad is not None and want.grad is not None
                check_close(
                    got.grad, want.grad[:, start:end], atol=1e-12, rtol=1e-12, what=f"{what} {name}"
                )
            origin = WORLD - 1 if reverse else 0
            assert tile[2].grad is not None and full[2].grad is not None
            want_h0 = full[2].grad if origin == RANK else torch.zeros_like(h0)
            check_close(tile[2].grad, want_h0, atol=1e-12, rtol=1e-12, what=f"{what} h0")


@checks.add
def block_tiles_equal_full_scan() -> None:
    mismatches = Mismatches()
    for steps in (2, 8, 17, 64):
        for k in (2, 3):
            jac, rhs, h0 = block_problem(steps, k, torch.float64, seed=10 * steps + k)
            start, end = time_shard_bounds(steps, RANK, WORLD)
            for reverse in (False, True):
                for with_h0 in (False, True):
                    init_state = h0 if with_h0 else None
                    ref = scan_block_diag(jac, rhs, init_state, reverse=reverse, backend="eager")
                    what = f"T={steps} k={k} reverse={reverse} h0={with_h0}"
                    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-5)):
                        y = scan_block_diag_context_parallel(
                            jac[:, start:end].to(dtype),
                            rhs[:, start:end].to(dtype),
                            h0.to(dtype) if with_h0 else None,
                            reverse=reverse,
                        )
                        assert y.dtype == dtype
                        mismatches.close(
                            y, ref[:, start:end], atol=tol, rtol=tol, what=f"{what} {dtype}"
                        )
    mismatches.raise_any()


@checks.add
def block_tile_gradients_equal_full_scan() -> None:
    mismatches = Mismatches()
    for steps in (2, 17):
        for k in (2, 3):
            for reverse in (False, True):
                jac, rhs, h0 = block_problem(steps, k, torch.float64, seed=300 + steps + k)
                weight = torch.randn(rhs.shape, generator=torch.Generator().manual_seed(7))
                weight = weight.to(rhs)
                full = [t.clone().requires_grad_(True) for t in (jac, rhs, h0)]
                ref = scan_block_diag(*full, reverse=reverse, backend="eager")
                (ref * weight).sum().backward()
                start, end = time_shard_bounds(steps, RANK, WORLD)
                tile = [jac[:, start:end].clone(), rhs[:, start:end].clone(), h0.clone()]
                for t in tile:
                    t.requires_grad_(True)
                y = scan_block_diag_context_parallel(*tile, reverse=reverse)
                (y * weight[:, start:end]).sum().backward()
                what = f"T={steps} k={k} reverse={reverse}"
                for name, got, want in zip(("jac", "rhs"), tile[:2], full[:2], strict=True):
                    assert got.grad is not None and want.grad is not None
                    mismatches.close(
                        got.grad,
                        want.grad[:, start:end],
                        atol=1e-12,
                        rtol=1e-12,
                        what=f"{what} {name}",
                    )
                origin = WORLD - 1 if reverse else 0
                assert tile[2].grad is not None and full[2].grad is not None
                want_h0 = full[2].grad if origin == RANK else torch.zeros_like(h0)
                mismatches.close(tile[2].grad, want_h0, atol=1e-12, rtol=1e-12, what=f"{what} h0")
    mismatches.raise_any()


@checks.add
def backend_equals_kernel_scan() -> None:
    backend = ContextParallelScan()
    for steps in (2, 17):
        for reverse in (False, True):
            jac, rhs, h0 = problem(steps, torch.float64, seed=200 + steps)
            got = backend(jac, rhs, h0, reverse=reverse, structure=pc.Diag())
            want = sequential_scan_diag(jac, rhs, h0, reverse=reverse)
            check_close(got, want, atol=1e-12, rtol=1e-12, what=f"T={steps} reverse={reverse}")
            jac, rhs, h0 = block_problem(steps, 3, torch.float64, seed=250 + steps)
            got = backend(jac, rhs, h0, reverse=reverse, structure=pc.Block(3))
            want = scan_block_diag(jac, rhs, h0, reverse=reverse, backend="eager")
            check_close(got, want, atol=1e-12, rtol=1e-12, what=f"block T={steps} rev={reverse}")


def newton_equals_eager(cell: pc.ParaCell) -> None:
    """Newton with scan_backend="context_parallel" equals "eager": states and every gradient."""
    torch.manual_seed(0)  # the same input on both ranks (the cell too): a replicated trajectory
    x = torch.randn(2, 17, 3, device=DEVICE, dtype=torch.float64)
    outs, grads = [], []
    for name in ("eager", "context_parallel"):
        config = pc.NewtonConfig(max_iters=17, scan_backend=name)
        x_leaf = x.clone().requires_grad_(True)
        cell.zero_grad()
        states, stats = pc.newton_apply(cell, x_leaf, config=config)
        assert stats.backend == name, stats
        ramp = torch.linspace(-1, 1, 17, dtype=x.dtype, device=DEVICE)
        (states * ramp.view(1, 17, *[1] * (states.dim() - 2))).sum().backward()
        outs.append(states.detach())
        assert x_leaf.grad is not None
        grads.append([x_leaf.grad, *(p.grad.clone() for p in cell.parameters())])
    check_close(outs[1], outs[0], atol=1e-12, rtol=1e-12, what="states")
    for i, (got, want) in enumerate(zip(grads[1], grads[0], strict=True)):
        check_close(got, want, atol=1e-11, rtol=1e-11, what=f"gradient {i}")


@checks.add
def newton_context_parallel_equals_eager() -> None:
    torch.manual_seed(0)
    newton_equals_eager(pc.ParaGRU(3, 4).to(DEVICE, torch.float64))


@checks.add
def newton_lstm_context_parallel_equals_eager() -> None:
    torch.manual_seed(1)
    cell = pc.ParaLSTM(3, 4).to(DEVICE, torch.float64)
    assert cell.structure == pc.Block(2)
    newton_equals_eager(cell)


@checks.add
def newton_slstm_context_parallel_equals_eager() -> None:
    torch.manual_seed(2)
    cell = pc.ParaSLSTM(3, 4).to(DEVICE, torch.float64)
    assert cell.structure == pc.Block(3)
    newton_equals_eager(cell)


def count_all_gathers(scan: object, jac: Tensor, rhs: Tensor, h0: Tensor) -> tuple[int, int]:
    """(forward, backward) all_gather calls of one differentiable context-parallel scan."""
    calls: list[str] = []
    real = dist.all_gather

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append("all_gather")
        return real(*args, **kwargs)

    dist.all_gather = counting
    try:
        start, end = time_shard_bounds(rhs.shape[1], RANK, WORLD)
        tile = jac[:, start:end].clone().requires_grad_(True)
        y = scan(tile, rhs[:, start:end], h0)  # type: ignore[operator]
        forward = len(calls)
        y.sum().backward()
        backward = len(calls) - forward
    finally:
        dist.all_gather = real
    return forward, backward


@checks.add
def one_collective_each_way() -> None:
    """Forward: the shape check plus one data all_gather; backward: one all_gather, no chain."""
    for name, scan, (jac, rhs, h0) in (
        ("diag", scan_diag_context_parallel, problem(9, torch.float64, seed=3)),
        ("block", scan_block_diag_context_parallel, block_problem(9, 3, torch.float64, seed=3)),
    ):
        forward, backward = count_all_gathers(scan, jac, rhs, h0)
        assert (forward, backward) == (2, 1), f"{name}: forward {forward}, backward {backward}"


@checks.add
def bad_inputs_raise_on_every_rank() -> None:
    # B differs between ranks: caught by the shape agreement, on both ranks.
    rhs = torch.zeros(2 + RANK, 3, D, device=DEVICE)
    expect_error(ValueError, "B must agree", lambda: scan_diag_context_parallel(rhs, rhs))
    # d differs.
    rhs = torch.zeros(2, 3, D + RANK, device=DEVICE)
    expect_error(ValueError, "d must agree", lambda: scan_diag_context_parallel(rhs, rhs))
    # A bad local shape on rank 1 only: rank 1 names it, rank 0 names rank 1.
    rhs = torch.zeros(2, 3, D, device=DEVICE)
    jac = rhs if RANK == 0 else rhs[:, :2]
    fragment = "jac_local must have rhs_local's shape" if RANK == 1 else "rank(s) [1]"
    expect_error(ValueError, fragment, lambda: scan_diag_context_parallel(jac, rhs))
    # T < world through the backend.
    one = torch.zeros(2, 1, D, device=DEVICE)
    backend = ContextParallelScan()
    expect_error(
        ValueError,
        "T >= world",
        lambda: backend(one, one, None, reverse=False, structure=pc.Diag()),
    )
    # Dense cells: a clear error before any collective.
    dense = torch.zeros(2, 4, D, D, device=DEVICE)
    expect_error(
        NotImplementedError,
        "Diag() and Block(k)",
        lambda: backend(dense, dense[..., 0], None, reverse=False, structure=pc.Dense()),
    )
    # Block tiles: k differs between ranks; B differs; a bad block on rank 1 only.
    rhs = torch.zeros(2, 3, D, 2 + RANK, device=DEVICE)
    jac = rhs.unsqueeze(-1).expand(*rhs.shape, rhs.shape[-1])
    expect_error(ValueError, "k (block size", lambda: scan_block_diag_context_parallel(jac, rhs))
    rhs = torch.zeros(2 + RANK, 3, D, 2, device=DEVICE)
    jac = rhs.unsqueeze(-1).expand(*rhs.shape, 2)
    expect_error(ValueError, "B must agree", lambda: scan_block_diag_context_parallel(jac, rhs))
    rhs = torch.zeros(2, 3, D, 2, device=DEVICE)
    jac = rhs.unsqueeze(-1).expand(*rhs.shape, 2 if RANK == 0 else 3)
    fragment = "jac_local must have shape [B, L, d, k, k]" if RANK == 1 else "rank(s) [1]"
    expect_error(ValueError, fragment, lambda: scan_block_diag_context_parallel(jac, rhs))
    # The backend: rhs's k must be the structure's.
    rhs = torch.zeros(2, 4, D, 2, device=DEVICE)
    jac = rhs.unsqueeze(-1).expand(*rhs.shape, 2)
    expect_error(
        ValueError,
        "k = 3 for Block(k=3)",
        lambda: backend(jac, rhs, None, reverse=False, structure=pc.Block(3)),
    )
    # After all that, the group still works: a real call succeeds.
    y = scan_diag_context_parallel(
        torch.ones(1, 2, 1, device=DEVICE), torch.ones(1, 2, 1, device=DEVICE)
    )
    check_close(y, torch.tensor([[[1.0], [2.0]]]) + 2.0 * RANK, what="after errors")


checks.run()
