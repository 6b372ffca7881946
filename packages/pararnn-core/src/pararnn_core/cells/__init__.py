"""Cells: the protocol (:class:`ParaCell`) and the built-in ParaGRU, ParaLSTM, ParaSLSTM."""

from .base import CellVJP, ParaCell, derive_jacobian
from .gru import ParaGRU
from .lstm import ParaLSTM
from .slstm import EMPTY_LOG_NORMALISER, ParaSLSTM

__all__ = [
    "EMPTY_LOG_NORMALISER",
    "CellVJP",
    "ParaCell",
    "ParaGRU",
    "ParaLSTM",
    "ParaSLSTM",
    "derive_jacobian",
]
