"""Tensor parallel along the hidden channels d_h (Megatron-style column/row split, DESIGN §3).

Why this works without communication inside the recurrence: the built-in cells have *diagonal*
recurrent weights (ParaGRU: one scalar per channel; ParaLSTM, ParaSLSTM: a small block per
channel), so channel ``i`` of ``h_t`` depends only on channel ``i`` of ``h_{t-1}`` and on its own
gate pre-activations. Splitting the channels over N ranks therefore splits Newton and every scan
into N independent problems. Channels mix only in the input projection (column-parallel: the
input is replicated, each rank computes its channels' gates) and in the output projection
(row-parallel: each rank multiplies its channels, one all-reduce sums the partial outputs).

Collectives of one block (N ranks, ``x [B, T, d_in]`` replicated):

* forward: one ``all_reduce`` (sum) of ``[B, T, d_out]`` after the row-parallel matmul;
* backward: its adjoint is the identity (each rank already holds the full ``∂L/∂y``); one
  ``all_reduce`` (sum) of ``∂L/∂x [B, T, d_in]`` at the block's input, because each rank's
  gates see x and contribute a partial ``∂L/∂x`` -- skipped when x needs no gradient.

Parameter shards, rank r owning channels ``c_r = [r d_h/N, (r+1) d_h/N)``, with G gates per
channel (GRU 3, LSTM 3, sLSTM 4) and ``W_x [G d_h, d_in]`` the unsharded projection whose rows are
gate-major (``row = g d_h + channel``):

=========================  ====================  =========================================
tensor                     shard shape            which part of the unsharded tensor
=========================  ====================  =========================================
``cell.proj.weight``       ``[G d_h/N, d_in]``   rows ``g d_h + c_r`` for each gate g
``cell.proj.bias``         ``[G d_h/N]``         the same rows
``cell.recurrent_weight``  ``[G, d_h/N]``        columns ``c_r``
``cell.peephole_weight``   ``[2, d_h/N]``        columns ``c_r`` (LSTM)
``out.weight``             ``[d_out, d_h/N]``    columns ``c_r`` of ``Linear(d_h, d_out)``
``out.bias``               ``[d_out]``           replicated (added once, after the reduce)
=========================  ====================  =========================================
"""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed import ProcessGroup

from pararnn_core import NewtonConfig, ParaCell, ParaGRU, ParaLSTM, ParaRNN, ParaSLSTM

from ._groups import group_rank, group_size, require_initialized

__all__ = [
    "ColumnParallelLinear",
    "RowParallelLinear",
    "TensorParallelDiagBlock",
    "copy_to_tensor_parallel",
    "reduce_from_tensor_parallel",
    "shard_cell",
    "tensor_parallel_diag_block",
]

CellKind = Literal["gru", "lstm", "slstm"]
_CELLS: dict[str, type[ParaCell]] = {"gru": ParaGRU, "lstm": ParaLSTM, "slstm": ParaSLSTM}
_GATES: dict[str, int] = {"gru": 3, "lstm": 3, "slstm": 4}


def _shard_width(name: str, total: int, group: ProcessGroup | None) -> int:
    world = group_size(group)
    if total % world != 0:
        raise ValueError(
            f"{name} = {total} is not divisible by the tensor-parallel group size {world}: "
            f"each rank must own {name} / {world} channels (pick {name} a multiple of {world})"
        )
    return total // world


# ----------------------------------------------------------------------------------------------
# The two collectives and their adjoints
# ----------------------------------------------------------------------------------------------


class _CopyToTensorParallel(torch.autograd.Function):
    """Forward identity on the replicated input; backward ``all_reduce`` (sum) of its gradient."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: ProcessGroup | None) -> Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=ctx.group)
        return grad, None


class _ReduceFromTensorParallel(torch.autograd.Function):
    """Forward ``all_reduce`` (sum) of the partial outputs; backward identity."""

    @staticmethod
    def forward(ctx: Any, partial: Tensor, group: ProcessGroup | None) -> Tensor:
        out = partial.contiguous().clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return grad, None


def copy_to_tensor_parallel(x: Tensor, group: ProcessGroup | None = None) -> Tensor:
    """``x`` unchanged (replicated, any shape); in backward, ``∂L/∂x`` is summed over ``group``.

    Collective: backward one ``all_reduce`` (sum) of ``x``'s shape; none in forward.
    """
    out: Tensor = _CopyToTensorParallel.apply(x, group)
    return out


def reduce_from_tensor_parallel(partial: Tensor, group: ProcessGroup | None = None) -> Tensor:
    """``Σ_ranks partial`` (replicated result, ``partial``'s shape); the backward is the identity.

    Collective: forward one ``all_reduce`` (sum); none in backward.
    """
    out: Tensor = _ReduceFromTensorParallel.apply(partial, group)
    return out


# ----------------------------------------------------------------------------------------------
# Linear layers
# ----------------------------------------------------------------------------------------------


class ColumnParallelLinear(nn.Module):
    """``Linear(d_in, d_out)`` with its output features split over ``group``.

    Shards: ``x [..., d_in]`` replicated; ``weight [d_out/N, d_in]`` = rows
    ``[r d_out/N, (r+1) d_out/N)`` of the unsharded weight; ``bias [d_out/N]``; output
    ``[..., d_out/N]`` (this rank's features). Collectives: none in forward; backward one
    ``all_reduce`` (sum) of ``∂L/∂x [..., d_in]``. Gradients: ``∂L/∂W_r = g_rᵀ x``,
    ``∂L/∂x = Σ_r g_r W_r``.

    Raises:
        RuntimeError: no initialised process group.
        ValueError: ``d_out`` not divisible by the group size (both numbers named).
    """

    def __init__(
        self,
        d_in: int,
        d_out: int,
        *,
        bias: bool = True,
        group: ProcessGroup | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        require_initialized("ColumnParallelLinear")
        self.group = group
        self.d_in, self.d_out = d_in, d_out
        self.d_out_local = _shard_width("d_out", d_out, group)
        self.local = nn.Linear(d_in, self.d_out_local, bias=bias, device=device, dtype=dtype)

    @classmethod
    def from_linear(
        cls, linear: nn.Linear, group: ProcessGroup | None = None
    ) -> ColumnParallelLinear:
        """This rank's shard of an unsharded ``linear`` (identical on every rank)."""
        layer = cls(
            linear.in_features,
            linear.out_features,
            bias=linear.bias is not None,
            group=group,
            device=linear.weight.device,
            dtype=linear.weight.dtype,
        )
        rows = slice(
            group_rank(group) * layer.d_out_local, (group_rank(group) + 1) * layer.d_out_local
        )
        with torch.no_grad():
            layer.local.weight.copy_(linear.weight[rows])
            if linear.bias is not None and layer.local.bias is not None:
                layer.local.bias.copy_(linear.bias[rows])
        return layer

    def forward(self, x: Tensor) -> Tensor:
        """``[..., d_in]`` replicated -> ``[..., d_out/N]``."""
        out: Tensor = self.local(copy_to_tensor_parallel(x, self.group))
        return out

    def extra_repr(self) -> str:
        return f"d_in={self.d_in}, d_out={self.d_out}, d_out_local={self.d_out_local}"


class RowParallelLinear(nn.Module):
    """``Linear(d_in, d_out)`` with its input features split over ``group``.

    Shards: ``x [..., d_in/N]`` (this rank's features); ``weight [d_out, d_in/N]`` = columns
    ``[r d_in/N, (r+1) d_in/N)`` of the unsharded weight; ``bias [d_out]`` replicated (broadcast
    from the group's rank 0 at construction), added once after the reduce; output ``[..., d_out]``
    replicated. Collectives: at construction one ``broadcast`` of the bias; forward one ``all_reduce``
    (sum) of ``[..., d_out]``; backward none (the all-reduce's adjoint is the identity).
    Gradients: ``∂L/∂x_r = g W_r``, ``∂L/∂W_r = gᵀ x_r``, ``∂L/∂b = Σ g`` (equal on every rank).

    Raises:
        RuntimeError: no initialised process group.
        ValueError: ``d_in`` not divisible by the group size (both numbers named).
    """

    def __init__(
        self,
        d_in: int,
        d_out: int,
        *,
        bias: bool = True,
        group: ProcessGroup | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        require_initialized("RowParallelLinear")
        self.group = group
        self.d_in, self.d_out = d_in, d_out
        self.d_in_local = _shard_width("d_in", d_in, group)
        self.weight = nn.Parameter(torch.empty(d_out, self.d_in_local, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.empty(d_out, device=device, dtype=dtype)) if bias else None
        with torch.no_grad():
            # nn.Linear's init for the unsharded layer: bound from the full fan-in d_in.
            bound = 1.0 / d_in**0.5
            self.weight.uniform_(-bound, bound)
            if self.bias is not None:
                self.bias.uniform_(-bound, bound)
                # The bias is added after the reduce, so it must be the same on every rank.
                dist.broadcast(
                    self.bias, src=dist.get_global_rank(group, 0) if group else 0, group=group
                )

    @classmethod
    def from_linear(cls, linear: nn.Linear, group: ProcessGroup | None = None) -> RowParallelLinear:
        """This rank's shard of an unsharded ``linear`` (identical on every rank)."""
        layer = cls(
            linear.in_features,
            linear.out_features,
            bias=linear.bias is not None,
            group=group,
            device=linear.weight.device,
            dtype=linear.weight.dtype,
        )
        rank = group_rank(group)
        with torch.no_grad():
            layer.weight.copy_(
                linear.weight[:, rank * layer.d_in_local : (rank + 1) * layer.d_in_local]
            )
            if linear.bias is not None and layer.bias is not None:
                layer.bias.copy_(linear.bias)
        return layer

    def forward(self, x: Tensor) -> Tensor:
        """``[..., d_in/N]`` -> ``[..., d_out]`` replicated (one all-reduce)."""
        if x.shape[-1] != self.d_in_local:
            raise ValueError(
                f"x must have this rank's d_in/N = {self.d_in_local} features in its last "
                f"dimension, got {x.shape[-1]}"
            )
        out = reduce_from_tensor_parallel(x @ self.weight.t(), self.group)
        return out if self.bias is None else out + self.bias

    def extra_repr(self) -> str:
        return f"d_in={self.d_in}, d_out={self.d_out}, d_in_local={self.d_in_local}"


# ----------------------------------------------------------------------------------------------
# Sharded cells and the block
# ----------------------------------------------------------------------------------------------


def _make_cell(
    kind: str,
    d_in: int,
    d_h: int,
    device: torch.device | str | None,
    dtype: torch.dtype | None,
) -> ParaCell:
    if kind == "gru":
        return ParaGRU(d_in, d_h, device=device, dtype=dtype)
    if kind == "lstm":
        return ParaLSTM(d_in, d_h, device=device, dtype=dtype)
    return ParaSLSTM(d_in, d_h, mix="diag", device=device, dtype=dtype)


def _kind_of(cell: ParaCell) -> str:
    for kind, cls in _CELLS.items():
        if type(cell) is cls:
            return kind
    raise TypeError(
        f"cell must be a ParaGRU, ParaLSTM or ParaSLSTM (per-channel recurrences), got "
        f"{type(cell).__name__}"
    )


def _check_kind(kind: object) -> str:
    if kind not in _CELLS:
        raise ValueError(f"kind must be one of {sorted(_CELLS)}, got {kind!r}")
    assert isinstance(kind, str)
    return kind


def shard_cell(cell: ParaCell, rank: int, world: int) -> ParaCell:
    """A new cell holding channels ``[rank d_h/world, (rank+1) d_h/world)`` of ``cell``.

    Shard shapes are in the module docstring (gate-major projection rows, recurrent columns).

    Raises:
        TypeError: not a built-in diagonal-recurrence cell.
        ValueError: ``cell.d_h`` not divisible by ``world``, or ``rank`` outside ``[0, world)``.
    """
    kind = _kind_of(cell)
    if world < 1 or rank < 0 or rank >= world:
        raise ValueError(
            f"rank must be in [0, world) with world >= 1, got rank={rank}, world={world}"
        )
    if cell.d_h % world != 0:
        raise ValueError(
            f"d_h = {cell.d_h} is not divisible by the tensor-parallel group size {world}"
        )
    width = cell.d_h // world
    channels = slice(rank * width, (rank + 1) * width)
    gates = _GATES[kind]
    ref = next(cell.parameters())
    local = _make_cell(kind, cell.d_in, width, ref.device, ref.dtype)
    state: dict[str, Tensor] = {}
    for name, value in cell.state_dict().items():
        if name == "proj.weight":
            state[name] = value.view(gates, cell.d_h, cell.d_in)[:, channels].reshape(-1, cell.d_in)
        elif name == "proj.bias":
            state[name] = value.view(gates, cell.d_h)[:, channels].reshape(-1)
        else:
            state[name] = value[:, channels]
    local.load_state_dict(state)
    return local


class TensorParallelDiagBlock(nn.Module):
    """One ParaRNN layer with its channels split over ``group``, then ``Linear(d_h, d_out)``.

    ``x [B, T, d_in]`` (replicated) -> column-parallel gates ``u_r [B, T, G d_h/N]`` -> Newton
    and scan on this rank's channels, no communication -> ``h_r [B, T, d_h/N]`` ->
    :class:`RowParallelLinear` -> ``y [B, T, d_out]`` (replicated). Collectives: forward one
    ``all_reduce`` of ``[B, T, d_out]``; backward one ``all_reduce`` of ``∂L/∂x [B, T, d_in]`` (only
    when x requires grad). Parameter shards: the module docstring's table.

    Attributes:
        rnn: the :class:`~pararnn_core.ParaRNN` of the local cell (``last_stats`` per rank).
        out: the :class:`RowParallelLinear`.
    """

    def __init__(
        self,
        cell: ParaCell,
        out: RowParallelLinear,
        config: NewtonConfig | None,
        group: ProcessGroup | None,
    ) -> None:
        super().__init__()
        self.group = group
        self.rnn = ParaRNN(cell, config)
        self.out = out

    @classmethod
    def from_unsharded(
        cls,
        cell: ParaCell,
        linear: nn.Linear,
        config: NewtonConfig | None = None,
        group: ProcessGroup | None = None,
    ) -> TensorParallelDiagBlock:
        """This rank's shard of ``cell`` followed by ``linear`` (both identical on every rank)."""
        require_initialized("TensorParallelDiagBlock.from_unsharded")
        if linear.in_features != cell.d_h:
            raise ValueError(
                f"linear.in_features must equal cell.d_h = {cell.d_h}, got {linear.in_features}"
            )
        _shard_width("d_h", cell.d_h, group)
        local = shard_cell(cell, group_rank(group), group_size(group))
        return cls(local, RowParallelLinear.from_linear(linear, group), config, group)

    def forward(self, x: Tensor) -> Tensor:
        """``[B, T, d_in]`` replicated -> ``[B, T, d_out]`` replicated."""
        h_local = self.rnn(copy_to_tensor_parallel(x, self.group))
        assert isinstance(h_local, Tensor)
        out: Tensor = self.out(h_local)
        return out


def tensor_parallel_diag_block(
    kind: CellKind,
    d_in: int,
    d_h: int,
    d_out: int,
    config: NewtonConfig | None = None,
    group: ProcessGroup | None = None,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> TensorParallelDiagBlock:
    """A freshly initialised :class:`TensorParallelDiagBlock`: ``kind`` cell, d_h split over ``group``.

    Each rank initialises its own shard (seed the ranks differently for independent channels);
    to shard an existing model use :meth:`TensorParallelDiagBlock.from_unsharded`.

    Args:
        kind: ``"gru"`` (ParaGRU), ``"lstm"`` (ParaLSTM) or ``"slstm"`` (ParaSLSTM, mix="diag").
        d_in: input features (x is replicated).
        d_h: hidden channels in total; rank r owns ``d_h / N``.
        d_out: output features (replicated).
        config: the Newton settings of the local ParaRNN.
        group: the tensor-parallel group (None: the default group).
        device, dtype: as for ``torch.nn`` modules.

    Raises:
        RuntimeError: no initialised process group.
        ValueError: unknown ``kind``, or ``d_h`` not divisible by the group size (both numbers).
    """
    require_initialized("tensor_parallel_diag_block")
    kind_name = _check_kind(kind)
    width = _shard_width("d_h", d_h, group)
    cell = _make_cell(kind_name, d_in, width, device, dtype)
    out = RowParallelLinear(d_h, d_out, group=group, device=device, dtype=dtype)
    return TensorParallelDiagBlock(cell, out, config, group)
