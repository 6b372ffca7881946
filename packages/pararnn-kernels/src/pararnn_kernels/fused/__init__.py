"""Fused per-cell layer kernels: Newton forward, eq. 2.6 backward and sequential recurrence.

One module per built-in cell -- :mod:`.gru` (diagonal), :mod:`.lstm` (2x2 blocks) and
:mod:`.slstm` (3x3 blocks, ``mix="diag"``) -- each stating its cell's equations and tensor
layouts, on launchers they share (:mod:`._layer`). ``pararnn_core``'s ``scan_backend="fused"``
and ``"auto"`` call these.
"""

from ._layer import (
    FUSED_DEFAULT_TOL,
    FusedNewtonResult,
    FusedPlan,
    check_fused_supported,
    summarize_fused_stats,
)
from .gru import (
    choose_fused_gru_method,
    estimate_fused_gru_seconds,
    fused_gru_backward,
    fused_gru_newton,
    fused_gru_sequential,
    plan_fused_gru,
    reference_gru_sequential,
)
from .lstm import (
    choose_fused_lstm_method,
    estimate_fused_lstm_seconds,
    fused_lstm_backward,
    fused_lstm_newton,
    fused_lstm_sequential,
    plan_fused_lstm,
    reference_lstm_sequential,
)
from .slstm import (
    SLSTM_EMPTY_LOG_NORMALISER,
    choose_fused_slstm_method,
    estimate_fused_slstm_seconds,
    fused_slstm_backward,
    fused_slstm_newton,
    fused_slstm_sequential,
    plan_fused_slstm,
    reference_slstm_sequential,
)

__all__ = [
    "FUSED_DEFAULT_TOL",
    "SLSTM_EMPTY_LOG_NORMALISER",
    "FusedNewtonResult",
    "FusedPlan",
    "check_fused_supported",
    "choose_fused_gru_method",
    "choose_fused_lstm_method",
    "choose_fused_slstm_method",
    "estimate_fused_gru_seconds",
    "estimate_fused_lstm_seconds",
    "estimate_fused_slstm_seconds",
    "fused_gru_backward",
    "fused_gru_newton",
    "fused_gru_sequential",
    "fused_lstm_backward",
    "fused_lstm_newton",
    "fused_lstm_sequential",
    "fused_slstm_backward",
    "fused_slstm_newton",
    "fused_slstm_sequential",
    "plan_fused_gru",
    "plan_fused_lstm",
    "plan_fused_slstm",
    "reference_gru_sequential",
    "reference_lstm_sequential",
    "reference_slstm_sequential",
    "summarize_fused_stats",
]
