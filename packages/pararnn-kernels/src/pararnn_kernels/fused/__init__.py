"""Fused per-cell layer kernels: Newton forward, eq. 2.6 backward and sequential recurrence.

One module per built-in diagonal cell (:mod:`.gru`); each states its cell's equations and tensor
layouts. ``pararnn_core``'s ``scan_backend="fused"`` and ``"auto"`` call these.
"""

from .gru import (
    FUSED_DEFAULT_TOL,
    FusedNewtonResult,
    FusedPlan,
    check_fused_supported,
    choose_fused_gru_method,
    estimate_fused_gru_seconds,
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
    "estimate_fused_gru_seconds",
    "fused_gru_backward",
    "fused_gru_newton",
    "fused_gru_sequential",
    "plan_fused_gru",
    "reference_gru_sequential",
]
