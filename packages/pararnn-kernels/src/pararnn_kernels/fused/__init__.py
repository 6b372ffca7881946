"""Fused per-cell layer kernels: Newton forward, eq. 2.6 backward and sequential recurrence.

One module per built-in diagonal cell (:mod:`.gru`), each stating its cell's equations and tensor
layouts, on launchers the cells share (:mod:`._layer`). ``pararnn_core``'s
``scan_backend="fused"`` and ``"auto"`` call these.
"""

from ._layer import FUSED_DEFAULT_TOL, FusedNewtonResult, FusedPlan, check_fused_supported
from .gru import (
    choose_fused_gru_method,
    fused_gru_backward,
    fused_gru_newton,
    fused_gru_sequential,
    plan_fused_gru,
    reference_gru_sequential,
)

__all__ = [
    "FUSED_DEFAULT_TOL",
    "FusedNewtonResult",
    "FusedPlan",
    "check_fused_supported",
    "choose_fused_gru_method",
    "fused_gru_backward",
    "fused_gru_newton",
    "fused_gru_sequential",
    "plan_fused_gru",
    "reference_gru_sequential",
]
