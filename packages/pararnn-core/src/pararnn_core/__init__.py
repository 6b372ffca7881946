"""pararnn_core: cells, the parallel Newton solver with its eq. 2.6 backward, and ParaRNN.

* Cells: :class:`ParaGRU` (diagonal Jacobian), :class:`ParaLSTM` (2x2 blocks),
  :class:`ParaSLSTM` (3x3 blocks), and the protocol :class:`ParaCell` for your own
  (Jacobian structures :class:`Diag`, :class:`Block`, :class:`Dense`); their input projection
  :class:`ProjectionLinear` (an ``nn.Linear`` whose float32 GPU GEMMs can run on tensor cores).
* Solver: :func:`newton_apply` (parallel Newton, differentiable by eq. 2.6), :func:`sequential_apply`
  (the step-by-step reference), :class:`NewtonConfig`, :class:`NewtonStats` (a
  :class:`DeferredNewtonStats` with ``NewtonConfig(stats="deferred")``),
  :class:`NewtonDivergenceError`, and the scan-backend registry (:func:`register_scan_backend`,
  :func:`get_scan_backend`, :func:`known_scan_backends`).
* Module: :class:`ParaRNN` -- Newton in ``.train()``, the sequential step in ``.eval()``.

The math is DESIGN §1; the cells' equations, Jacobians and inits are in ``docs/cells.md``.
"""

from .backends import (
    ENTRY_POINT_GROUP,
    KernelScan,
    ScanBackend,
    get_scan_backend,
    known_scan_backends,
    register_scan_backend,
    unregister_scan_backend,
)
from .cells import (
    CellVJP,
    ParaCell,
    ParaGRU,
    ParaLSTM,
    ParaSLSTM,
    ProjectionLinear,
    derive_jacobian,
)
from .config import DeferredNewtonStats, NewtonConfig, NewtonDivergenceError, NewtonStats
from .fused import fused_sequential_apply, has_fused_kernels
from .module import ParaRNN
from .newton import newton_apply, sequential_apply
from .structures import Block, Dense, Diag, Structure

__version__ = "0.1.0"

__all__ = [
    "ENTRY_POINT_GROUP",
    "Block",
    "CellVJP",
    "DeferredNewtonStats",
    "Dense",
    "Diag",
    "KernelScan",
    "NewtonConfig",
    "NewtonDivergenceError",
    "NewtonStats",
    "ParaCell",
    "ParaGRU",
    "ParaLSTM",
    "ParaRNN",
    "ParaSLSTM",
    "ProjectionLinear",
    "ScanBackend",
    "Structure",
    "__version__",
    "derive_jacobian",
    "fused_sequential_apply",
    "get_scan_backend",
    "has_fused_kernels",
    "known_scan_backends",
    "newton_apply",
    "register_scan_backend",
    "sequential_apply",
    "unregister_scan_backend",
]
