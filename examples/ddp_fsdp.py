"""Data-parallel ParaRNN training with DDP or FSDP2 (set STRATEGY below).

    uv run torchrun --nproc_per_node=2 examples/ddp_fsdp.py

Runs on CPUs (gloo) and on GPUs (NCCL, one GPU per process). What it shows:

* ParaRNN needs no wrapper of its own: every cell weight is an explicit input of the Newton
  autograd Function, so DDP (``find_unused_parameters=False``) and FSDP2 ``fully_shard`` see it
  like any ``nn.Linear``;
* ``warmup_scan_kernels`` runs one Newton forward before DDP wraps the model (or before FSDP2's
  first step), so Triton compiles before NCCL's heartbeat watches a step;
* each rank solves Newton on its own batch and prints its own residuals;
* float32 by default; with ``BF16 = True``, bfloat16 only when *every* rank's GPU has compute
  capability >= 8.0 -- a mixed group (or CPUs) falls back to float32 on all ranks and says so.
"""

from __future__ import annotations

import os

# Triton's first compile can outlast NCCL's default heartbeat; warm-up avoids it, this is a net.
os.environ.setdefault("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "1800")

import torch
import torch.distributed as dist
from torch import Tensor, nn

from pararnn_core import NewtonConfig, ParaGRU, ParaLSTM, ParaRNN
from pararnn_dist import last_newton_residuals, warmup_scan_kernels
from pararnn_examples.torchrun import format_residuals, init_distributed, say

STRATEGY = "ddp"  # or "fsdp"
BF16 = False  # ask for bfloat16; granted only if every rank's GPU has CC >= 8.0
STEPS, BATCH, T, D_IN, D_H = 5, 4, 64, 8, 32


def pick_dtype(device: torch.device, rank: int) -> torch.dtype:
    """bfloat16 if asked for and every rank's device is CC >= 8.0, else float32 (for all ranks)."""
    if not BF16:
        return torch.float32
    capable = device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 0)
    flag = torch.tensor([1 if capable else 0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    if int(flag.item()) == 1:
        return torch.bfloat16
    if rank == 0:
        say("bf16 asked for, but not every rank's device has compute capability >= 8.0: float32")
    return torch.float32


def batch(step: int, rank: int, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """A toy task: predict the running mean of the inputs' first feature."""
    gen = torch.Generator().manual_seed(1000 * step + rank)  # each rank its own data
    x = torch.randn(BATCH, T, D_IN, generator=gen)
    target = x[..., :1].cumsum(1) / torch.arange(1, T + 1).view(1, T, 1)
    return x.to(device, dtype), target.to(device, dtype)


def main() -> None:
    rank, _world, device = init_distributed()
    dtype = pick_dtype(device, rank)
    torch.manual_seed(0)  # the same initial weights on every rank
    model = nn.Sequential(
        ParaRNN([ParaGRU(D_IN, D_H), ParaLSTM(D_H, D_H)], NewtonConfig(max_iters=4)),
        nn.Linear(D_H, 1),
    ).to(device, dtype)
    example, _ = batch(0, rank, device, dtype)

    wrapped: nn.Module
    if STRATEGY == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        warmup_scan_kernels(model, example)  # before the wrap
        wrapped = DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    elif STRATEGY == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        fully_shard(model[0], mesh=mesh)
        fully_shard(model, mesh=mesh)
        wrapped = model
        warmup_scan_kernels(wrapped, example)  # before the first step
    else:
        raise ValueError(f"STRATEGY must be 'ddp' or 'fsdp', got {STRATEGY!r}")

    optimizer = torch.optim.AdamW(wrapped.parameters(), lr=1e-2)
    for step in range(STEPS):
        x, target = batch(step, rank, device, dtype)
        loss = (wrapped(x) - target).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        residuals = format_residuals(last_newton_residuals(wrapped))
        say(
            f"[rank {rank}] {STRATEGY} step {step}: loss {loss.item():.4f}, Newton residuals {residuals}"
        )

    del wrapped, model, optimizer  # before the group: FSDP2 on gloo can crash at exit otherwise
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
