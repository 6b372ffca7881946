"""pararnn_kernels: Triton linear-recurrence scans with capability/dtype dispatch.

Public ops (all differentiable; the scans registered with ``torch.library``):

* :func:`scan_diag` -- ``y_t = jac_t ⊙ y_{t-1} + rhs_t`` over ``[B, T, D]``.
* :func:`scan_block_diag` -- ``y_t = jac_t @ y_{t-1} + rhs_t`` with ``k x k`` blocks per channel.
* :func:`linear_tf32x3` -- a float32 ``x @ weight.T + bias`` on tensor cores to float32 accuracy
  (the cells' input projections; traced calls run ``F.linear``).

Backends: ``"triton"``, ``"eager"`` (pure torch, log-depth; the oracle and the CPU path) and
``"auto"``. :mod:`pararnn_kernels.dispatch` decides backend and dtypes from the tensor's device.
"""

from .dispatch import KNOWN_BACKENDS, resolve_scan_backend
from .linear import linear_tf32x3
from .scan import (
    MAX_TRITON_BLOCK,
    reference_scan_block_diag,
    reference_scan_diag,
    scan_block_diag,
    scan_diag,
    sequential_scan_block_diag,
    sequential_scan_diag,
)

__version__ = "0.1.0"

__all__ = [
    "KNOWN_BACKENDS",
    "MAX_TRITON_BLOCK",
    "__version__",
    "linear_tf32x3",
    "reference_scan_block_diag",
    "reference_scan_diag",
    "resolve_scan_backend",
    "scan_block_diag",
    "scan_diag",
    "sequential_scan_block_diag",
    "sequential_scan_diag",
]
