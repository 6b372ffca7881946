"""Process-group helpers shared by the parallel modules: the initialised check, rank and size,
the device a collective's buffers live on, and a shape agreement check that cannot hang.

The agreement check is the pattern every public collective in this package starts with: each
rank validates its own inputs *locally* first, then all ranks exchange one small int64 vector
(``[ok, *dims]``) in a single ``all_gather``. A rank whose local check failed still joins that
collective (with ``ok = 0``) before it raises, so the others learn about it and raise too instead
of waiting forever in the next, payload-sized collective.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

__all__ = [
    "DTYPE_CODES",
    "agree_across_ranks",
    "comm_device",
    "group_rank",
    "group_size",
    "require_initialized",
]

#: Small integer codes for the dtypes a scan accepts (exchanged in the agreement check).
DTYPE_CODES: dict[torch.dtype, int] = {
    torch.float64: 1,
    torch.float32: 2,
    torch.float16: 3,
    torch.bfloat16: 4,
}


def require_initialized(what: str) -> None:
    """Raise ``RuntimeError`` unless the default process group exists."""
    if not dist.is_available():
        raise RuntimeError(f"{what} needs torch.distributed, which this torch build lacks")
    if not dist.is_initialized():
        raise RuntimeError(
            f"{what} needs an initialised process group: call "
            "torch.distributed.init_process_group(...) first (e.g. launch with torchrun)"
        )


def group_rank(group: ProcessGroup | None) -> int:
    """This process's rank inside ``group`` (None: the default group)."""
    return int(dist.get_rank(group))


def group_size(group: ProcessGroup | None) -> int:
    """Number of ranks in ``group`` (None: the default group)."""
    return int(dist.get_world_size(group))


def comm_device(group: ProcessGroup | None) -> torch.device:
    """Where collective buffers must live: the current CUDA device for NCCL, else the CPU."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def agree_across_ranks(
    what: str,
    local_error: str | None,
    dims: Sequence[int],
    names: Sequence[str],
    group: ProcessGroup | None,
) -> list[list[int]]:
    """One ``all_gather`` of ``[ok, *dims]``; raise on every rank if any rank failed or dims differ.

    Args:
        what: the calling function, for messages.
        local_error: this rank's own validation message, or None when its inputs are fine.
        dims: this rank's integers to compare (``len(dims) == len(names)``; ignored if failed).
        names: what each integer is (``"B"``, ``"d"``, ...), for messages.
        group: the process group.

    Returns:
        Every rank's dims, indexed by group rank.

    Raises:
        ValueError: this rank's ``local_error``; another rank's failure; or dims that differ
            between ranks (naming both ranks and both values).
    """
    ok = 1 if local_error is None else 0
    values = [0] * len(names) if local_error is not None else [int(v) for v in dims]
    mine = torch.tensor([ok, *values], dtype=torch.int64, device=comm_device(group))
    gathered = [torch.empty_like(mine) for _ in range(group_size(group))]
    dist.all_gather(gathered, mine, group=group)
    rows = [[int(v) for v in g.tolist()] for g in gathered]
    if local_error is not None:
        raise ValueError(local_error)
    failed = [r for r, row in enumerate(rows) if row[0] != 1]
    if failed:
        raise ValueError(
            f"{what}: rank(s) {failed} of the group rejected their inputs (see the error on those "
            "ranks); no rank continued to the data collective"
        )
    first = rows[0][1:]
    for r, row in enumerate(rows[1:], start=1):
        for name, a, b in zip(names, first, row[1:], strict=True):
            if a != b:
                raise ValueError(
                    f"{what}: {name} must agree across ranks, but rank 0 has {name} = {a} and "
                    f"rank {r} has {name} = {b}"
                )
    return [row[1:] for row in rows]
