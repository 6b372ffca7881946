"""Context parallel along time: each rank holds a tile of the sequence's steps.

    uv run torchrun --nproc_per_node=2 examples/context_parallel.py

Part 1 calls ``scan_diag_context_parallel`` on each rank's tile (``time_shard_bounds``) and checks
the tiles against one full ``scan_diag``, forward and backward. Part 2 trains a ParaGRU whose
Newton scans run with ``NewtonConfig(scan_backend="context_parallel")``: the trajectory is
replicated, each rank scans its time tile, and the tiles are all-gathered back. CPUs (gloo) or
GPUs (NCCL).
"""

from __future__ import annotations

import os

os.environ.setdefault("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "1800")

import torch
import torch.distributed as dist

from pararnn_core import NewtonConfig, ParaGRU, ParaRNN
from pararnn_dist import last_newton_residuals, scan_diag_context_parallel, time_shard_bounds
from pararnn_examples.torchrun import format_residuals, init_distributed, say
from pararnn_kernels import scan_diag

B, T, D = 2, 1000, 16


def main() -> None:
    rank, world, device = init_distributed()

    # 1. The scan itself, on tiles.
    torch.manual_seed(0)  # the same full problem everywhere, so each rank can check its tile
    jac = torch.empty(B, T, D, device=device).uniform_(0.9, 0.999)
    rhs = torch.randn(B, T, D, device=device)
    start, end = time_shard_bounds(T, rank, world)
    jac_tile = jac[:, start:end].clone().requires_grad_(True)
    rhs_tile = rhs[:, start:end].clone().requires_grad_(True)
    y_tile = scan_diag_context_parallel(jac_tile, rhs_tile)
    y_tile.sum().backward()
    full_jac, full_rhs = jac.clone().requires_grad_(True), rhs.clone().requires_grad_(True)
    y_full = scan_diag(full_jac, full_rhs)
    y_full.sum().backward()
    assert full_rhs.grad is not None and rhs_tile.grad is not None
    err = (y_tile - y_full[:, start:end]).abs().max().item()
    grad_err = (rhs_tile.grad - full_rhs.grad[:, start:end]).abs().max().item()
    say(f"[rank {rank}] steps [{start}, {end}): max |tile - full| {err:.1e}, grad {grad_err:.1e}")

    # 2. Newton with the context-parallel scan backend (a replicated trajectory).
    torch.manual_seed(1)
    model = ParaRNN(ParaGRU(8, D), NewtonConfig(max_iters=4, scan_backend="context_parallel"))
    model = model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(B, 256, 8, device=device)
    for step in range(3):
        loss = model(x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        say(
            f"[rank {rank}] step {step}: loss {loss.item():.4f}, residuals {format_residuals(last_newton_residuals(model))}"
        )
    del model, optimizer
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
