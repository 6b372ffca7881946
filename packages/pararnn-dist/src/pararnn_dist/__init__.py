"""pararnn_dist: everything in ParaRNN that needs ``torch.distributed`` (DESIGN §3).

* Data parallel (:mod:`pararnn_dist.data_parallel`): :func:`warmup_scan_kernels`,
  :func:`last_newton_residuals` -- ParaRNN itself needs no wrapper for DDP or FSDP2.
* Tensor parallel along d_h (:mod:`pararnn_dist.tensor_parallel`):
  :func:`tensor_parallel_diag_block`, :class:`ColumnParallelLinear`, :class:`RowParallelLinear`.
* Context parallel along time (:mod:`pararnn_dist.context_parallel`): :func:`time_shard_bounds`,
  :func:`scan_diag_context_parallel`, :func:`scan_block_diag_context_parallel`,
  :func:`scan_diag_two_ranks` and the ``"context_parallel"`` scan backend
  (``NewtonConfig(scan_backend="context_parallel")``, diagonal and block-diagonal cells).

``docs/distributed.md`` is the guide.
"""

from .context_parallel import (
    ContextParallelScan,
    context_parallel_scan,
    scan_block_diag_context_parallel,
    scan_diag_context_parallel,
    scan_diag_two_ranks,
    time_shard_bounds,
)
from .data_parallel import find_pararnn_modules, last_newton_residuals, warmup_scan_kernels
from .tensor_parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    TensorParallelDiagBlock,
    tensor_parallel_diag_block,
)

__version__ = "0.1.0"

__all__ = [
    "ColumnParallelLinear",
    "ContextParallelScan",
    "RowParallelLinear",
    "TensorParallelDiagBlock",
    "__version__",
    "context_parallel_scan",
    "find_pararnn_modules",
    "last_newton_residuals",
    "scan_block_diag_context_parallel",
    "scan_diag_context_parallel",
    "scan_diag_two_ranks",
    "tensor_parallel_diag_block",
    "time_shard_bounds",
    "warmup_scan_kernels",
]
