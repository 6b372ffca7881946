"""Cells: the protocol (:class:`ParaCell`), the built-in ParaGRU, ParaLSTM, ParaSLSTM, and their
input projection (:class:`ProjectionLinear`)."""

from .base import CellVJP, ParaCell, derive_jacobian
from .gru import ParaGRU
from .lstm import ParaLSTM
from .projection import ProjectionLinear
from .slstm import EMPTY_LOG_NORMALISER, ParaSLSTM

__all__ = [
    "EMPTY_LOG_NORMALISER",
    "CellVJP",
    "ParaCell",
    "ParaGRU",
    "ParaLSTM",
    "ParaSLSTM",
    "ProjectionLinear",
    "derive_jacobian",
]
