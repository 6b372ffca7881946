"""What every ``torchrun`` example repeats: process-group setup from the launcher's environment,
rank-safe printing, and residual formatting.

``init_distributed`` reads ``RANK`` / ``LOCAL_RANK`` (set by ``torchrun``), picks NCCL with one
GPU per process when CUDA is available and gloo on CPUs otherwise, and sets the device from
``LOCAL_RANK``. The example ends with ``dist.destroy_process_group()`` after deleting its model.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

__all__ = ["format_residuals", "init_distributed", "say"]


def init_distributed() -> tuple[int, int, torch.device]:
    """Initialise the default process group; returns ``(rank, world_size, device)``.

    Raises:
        RuntimeError: not started by a launcher (``RANK`` or ``LOCAL_RANK`` unset).
    """
    try:
        rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    except KeyError as missing:
        raise RuntimeError(
            f"environment variable {missing} is not set: start this script with "
            "`uv run torchrun --nproc_per_node=N <script>`"
        ) from None
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl")
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    return rank, dist.get_world_size(), device


def say(message: str) -> None:
    """Print one line in one write, so the ranks' lines do not interleave mid-line."""
    print(message + "\n", end="", flush=True)


def format_residuals(values: list[float]) -> str:
    """``[1.2e-07, 3.0e-08]``: Newton residuals, one per ParaRNN layer."""
    return "[" + ", ".join(f"{v:.1e}" for v in values) + "]"
