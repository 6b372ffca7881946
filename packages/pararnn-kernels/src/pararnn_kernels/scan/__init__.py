"""Linear-recurrence scans: public ops, Triton launchers and pure-torch references."""

from .ops import MAX_TRITON_BLOCK, scan_block_diag, scan_diag
from .reference import (
    reference_scan_block_diag,
    reference_scan_diag,
    sequential_scan_block_diag,
    sequential_scan_diag,
)

__all__ = [
    "MAX_TRITON_BLOCK",
    "reference_scan_block_diag",
    "reference_scan_diag",
    "scan_block_diag",
    "scan_diag",
    "sequential_scan_block_diag",
    "sequential_scan_diag",
]
