"""Tensor parallel along d_h: one ParaRNN layer whose channels are split over the ranks.

    uv run torchrun --nproc_per_node=2 examples/tensor_parallel.py

Rank r owns d_h/N channels: its share of the gate projection (column-parallel, x replicated),
its Newton solve and scan (no communication: the recurrences are per channel), and its columns
of the output Linear (row-parallel: one all-reduce per block in forward, one for ∂L/∂x in
backward). Checks the sharded block against the unsharded layer built from the same weights,
then trains a few steps. CPUs (gloo) or GPUs (NCCL).
"""

from __future__ import annotations

import os

os.environ.setdefault("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "1800")

import torch
import torch.distributed as dist
from torch import nn

from pararnn_core import NewtonConfig, ParaRNN, ParaSLSTM
from pararnn_dist import TensorParallelDiagBlock, last_newton_residuals, tensor_parallel_diag_block
from pararnn_examples.torchrun import format_residuals, init_distributed, say

B, T, D_IN, D_H, D_OUT = 4, 64, 8, 32, 8


def main() -> None:
    rank, world, device = init_distributed()
    config = NewtonConfig(max_iters=4)

    # 1. Shard an existing layer: the same unsharded weights on every rank.
    torch.manual_seed(0)
    cell, head = ParaSLSTM(D_IN, D_H).to(device), nn.Linear(D_H, D_OUT).to(device)
    x = torch.randn(B, T, D_IN, device=device)  # replicated input
    block = TensorParallelDiagBlock.from_unsharded(cell, head, config)
    with torch.no_grad():
        err = (block(x) - head(ParaRNN(cell, config)(x))).abs().max().item()
    local = block.rnn.cells[0]
    say(
        f"[rank {rank}] sLSTM shard: proj.weight {list(local.proj.weight.shape)}, "
        f"out.weight {list(block.out.weight.shape)}; max |sharded - unsharded| = {err:.1e}"
    )

    # 2. A fresh block per kind, trained a few steps (each rank initialises its own shard).
    torch.manual_seed(1 + rank)
    model = tensor_parallel_diag_block("gru", D_IN, D_H, D_OUT, config, device=device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(3):
        target = x[..., :D_OUT].cumsum(1) / T
        loss = (model(x) - target).square().mean()  # y is replicated: the same loss on all ranks
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        say(
            f"[rank {rank}] step {step}: loss {loss.item():.4f}, residuals {format_residuals(last_newton_residuals(model))}"
        )
    if rank == 0:
        say(f"{world} ranks, d_h = {D_H} -> {D_H // world} channels per rank")
    del model, optimizer, block
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
