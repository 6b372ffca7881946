"""Checks at the public boundary: errors name the argument, the expected and the actual value."""

from __future__ import annotations

import torch
from torch import Tensor

from .cells.base import ParaCell

__all__ = ["check_cell", "check_sequence", "check_state", "check_step_input"]


def check_cell(cell: object, name: str = "cell") -> ParaCell:
    if not isinstance(cell, ParaCell):
        raise TypeError(f"{name} must be a pararnn_core.ParaCell, got {type(cell).__name__}")
    return cell


def _reference(cell: ParaCell) -> Tensor | None:
    return next(iter(cell.parameters()), None)


def _check_floating(name: str, value: object) -> Tensor:
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if not value.is_floating_point():
        raise TypeError(f"{name} must have a floating dtype, got {value.dtype}")
    return value


def _check_matches_cell(name: str, value: Tensor, cell: ParaCell) -> None:
    ref = _reference(cell)
    if ref is None:
        return
    if value.dtype != ref.dtype:
        raise TypeError(
            f"{name} must have the cell's parameter dtype {ref.dtype}, got {value.dtype}"
        )
    if value.device != ref.device:
        raise ValueError(
            f"{name} must be on the cell's parameter device {ref.device}, got {value.device}"
        )


def check_sequence(cell: ParaCell, x: object, name: str = "x") -> Tensor:
    """``x`` must be a floating ``[B, T, d_in]`` tensor with B, T >= 1 on the cell's device/dtype."""
    x_t = _check_floating(name, x)
    if x_t.dim() != 3:
        raise ValueError(
            f"{name} must have 3 dimensions [B, T, d_in], got {x_t.dim()} (shape {tuple(x_t.shape)})"
        )
    batch, steps, features = x_t.shape
    if steps == 0:
        raise ValueError(f"{name} must have at least one time step: T = {name}.shape[1] is 0")
    if batch == 0:
        raise ValueError(f"{name} must have at least one sequence: B = {name}.shape[0] is 0")
    if features != cell.d_in:
        raise ValueError(
            f"{name} must have d_in = {cell.d_in} features in its last dimension, got {features}"
        )
    _check_matches_cell(name, x_t, cell)
    return x_t


def check_step_input(cell: ParaCell, x_t: object, name: str = "x_t") -> Tensor:
    """``x_t`` must be a floating ``[B, d_in]`` tensor on the cell's device/dtype."""
    x_v = _check_floating(name, x_t)
    if x_v.dim() != 2:
        raise ValueError(
            f"{name} must have 2 dimensions [B, d_in], got {x_v.dim()} (shape {tuple(x_v.shape)})"
        )
    if x_v.shape[0] == 0:
        raise ValueError(f"{name} must have at least one sequence: B = {name}.shape[0] is 0")
    if x_v.shape[1] != cell.d_in:
        raise ValueError(
            f"{name} must have d_in = {cell.d_in} features in its last dimension, "
            f"got {x_v.shape[1]}"
        )
    _check_matches_cell(name, x_v, cell)
    return x_v


def check_state(cell: ParaCell, h0: object, batch: int, like: Tensor, name: str = "h0") -> Tensor:
    """``h0`` as given (shape ``[B, *cell.state_shape]``, like's dtype/device), or the empty state."""
    if h0 is None:
        return cell.initial_state(batch, device=like.device, dtype=like.dtype)
    h0_t = _check_floating(name, h0)
    expected = (batch, *cell.state_shape)
    if tuple(h0_t.shape) != expected:
        layout = "[B, d_h]" if len(cell.state_shape) == 1 else "[B, d_h, k]"
        raise ValueError(
            f"{name} must have shape {layout} = {expected} for this {type(cell).__name__}, "
            f"got {tuple(h0_t.shape)}"
        )
    if h0_t.dtype != like.dtype:
        raise TypeError(f"{name} must have the input's dtype {like.dtype}, got {h0_t.dtype}")
    if h0_t.device != like.device:
        raise ValueError(f"{name} must be on the input's device {like.device}, got {h0_t.device}")
    return h0_t


def float_eps(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).eps)
