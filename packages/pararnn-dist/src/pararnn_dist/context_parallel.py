"""Context parallel along time: each rank holds a contiguous tile of the steps of a diagonal
linear recurrence and the ranks stitch their tiles together with one collective (DESIGN §3).

Why this file exists: a sequence too long for one device (or one Newton scan too slow on one)
is split along T. The recurrence ``y_t = a_t ⊙ y_{t-1} + b_t`` is a prefix product of the pairs
``(a_t, b_t)`` under ``(a2, b2)∘(a1, b1) = (a2 a1, a2 b1 + b2)``, so a tile is summarised by one
pair of shape ``[B, d]`` -- its *monoid* ``(P_end, y_end)`` with ``P_end = Π_{t in tile} a_t`` and
``y_end`` the tile's last state when scanned from zero.

Protocol (forward, rank r of N, tile ``[s_r, e_r) = time_shard_bounds(T, r, N)``):

1. local: ``z = scan_diag(a_tile, b_tile, 0)`` and ``P_t = Π_{s_r ≤ τ ≤ t} a_τ`` (cumprod);
2. **one** ``all_gather`` of the stacked ``[4, B, d]`` tensor ``(P_end, y_end, a_first, h0)``
   (``a_first = a_{s_r}``, needed by the backward of rank r-1; ``h0`` is read from rank 0);
3. carry ``c_r = ((P_{r-1}, y_{r-1}) ∘ ... ∘ (P_0, y_0)) · h0`` (the exclusive prefix over ranks
   ``< r`` applied to ``h0``), computed redundantly on every rank from the gathered monoids;
4. local: ``y_t = z_t + P_t ⊙ c_r``.

Backward (the mirrored protocol): with ``g = ∂L/∂y`` on each rank's tile, the adjoint is the
reverse recurrence ``μ_t = g_t + a_{t+1} μ_{t+1}`` (``μ_{T-1} = g_{T-1}``). Rank r scans its tile
backwards from zero with the shifted multipliers ``α_t = a_{t+1}`` -- the last one is
``a_{e_r} = a_first`` of rank r+1, taken from the forward's gather -- and **one** ``all_gather`` of
the reverse monoids ``(Q_start, ν_start)`` gives every rank its carry from the right in one
collective (not a rank-by-rank chain). Then ``∂L/∂b = μ``, ``∂L/∂a_t = μ_t ⊙ y_{t-1}`` (with
``y_{s_r - 1} = c_r``) and, on rank 0, ``∂L/∂h0 = a_0 ⊙ μ_0``.

``reverse=True`` runs the same algebra with time and the rank order mirrored: the recurrence is
``y_t = a_t ⊙ y_{t+1} + b_t`` with ``y_T = h0`` read from the last rank.

Contents: :func:`time_shard_bounds`, :func:`scan_diag_context_parallel` (differentiable),
:class:`ContextParallelScan` / :data:`context_parallel_scan` (the ``"context_parallel"`` scan
backend of pararnn-core, loaded through the entry-point group ``pararnn.scan_backends``) and
:func:`scan_diag_two_ranks` (the protocol on two CUDA streams of one device).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.autograd.function import once_differentiable
from torch.distributed import ProcessGroup

from pararnn_core import Block, Dense, Diag, Structure
from pararnn_kernels import scan_diag
from pararnn_kernels.dispatch import compute_dtype

from ._groups import (
    DTYPE_CODES,
    agree_across_ranks,
    group_rank,
    group_size,
    require_initialized,
)

__all__ = [
    "ContextParallelScan",
    "context_parallel_scan",
    "scan_diag_context_parallel",
    "scan_diag_two_ranks",
    "time_shard_bounds",
]

_DTYPE_NAMES = "dtype code (1=float64, 2=float32, 3=float16, 4=bfloat16)"


def time_shard_bounds(T: int, rank: int, world: int) -> tuple[int, int]:
    """The steps ``[start, end)`` rank ``rank`` of ``world`` holds of a length-``T`` sequence.

    Contiguous tiles that cover ``[0, T)`` in rank order; the first ``T % world`` ranks hold one
    extra step, so tile lengths differ by at most one.

    Raises:
        TypeError: a non-int argument.
        ValueError: ``world < 1``, ``rank`` outside ``[0, world)``, or ``T < world`` (some rank
            would hold no step).

    Example:
        >>> [time_shard_bounds(10, r, 4) for r in range(4)]
        [(0, 3), (3, 6), (6, 8), (8, 10)]
    """
    for name, value in (("T", T), ("rank", rank), ("world", world)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if world < 1:
        raise ValueError(f"world must be >= 1, got {world}")
    if rank < 0 or rank >= world:
        raise ValueError(f"rank must be in [0, world) = [0, {world}), got {rank}")
    if world > T:
        raise ValueError(
            f"T = {T} time steps cannot be split over world = {world} ranks: every rank needs at "
            f"least one step (T >= world)"
        )
    base, extra = divmod(T, world)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


# ----------------------------------------------------------------------------------------------
# The chain: one tile of a recurrence running along increasing time, ranks in `order`
# ----------------------------------------------------------------------------------------------


def _chain_scan(
    a: Tensor,
    b: Tensor,
    h0: Tensor | None,
    order: list[int],
    pos: int,
    group: ProcessGroup | None,
    backend: str,
    exchange_h0: bool,
) -> tuple[Tensor, Tensor, list[Tensor]]:
    """Scan the tile ``a, b [B, L, d]`` (compute dtype) that sits at position ``pos`` of ``order``.

    ``order`` lists the ranks in the recurrence's direction: the state flows from ``order[0]``'s
    tile into ``order[1]``'s, and so on. One ``all_gather`` of ``(P_end, y_end, a_first, h0)``
    ``[4, B, d]`` (``[3, B, d]`` without ``exchange_h0``; h0 is then zero).

    Returns:
        ``y [B, L, d]`` (the exact states), the carry ``[B, d]`` the tile received (the state
        before its first step) and every rank's gathered ``[S, B, d]`` slots, by group rank.
    """
    z = scan_diag(a, b, None, backend=backend)
    prod = torch.cumprod(a, dim=1)
    slots = [prod[:, -1], z[:, -1], a[:, 0]]
    if exchange_h0:
        slots.append(torch.zeros_like(z[:, 0]) if h0 is None else h0)
    mine = torch.stack(slots).contiguous()
    gathered = [torch.empty_like(mine) for _ in range(len(order))]
    dist.all_gather(gathered, mine, group=group)
    carry = gathered[order[0]][3].clone() if exchange_h0 else torch.zeros_like(z[:, 0])
    for q in order[:pos]:
        carry = gathered[q][0] * carry + gathered[q][1]
    return z + prod * carry.unsqueeze(1), carry, gathered


def _direction(rank: int, world: int, reverse: bool) -> tuple[list[int], int]:
    order = list(range(world - 1, -1, -1)) if reverse else list(range(world))
    return order, order.index(rank)


def _flip_if(x: Tensor, reverse: bool) -> Tensor:
    return x.flip(1) if reverse else x


class _ContextParallelScanFunction(torch.autograd.Function):
    """``y_tile = CP-scan(a_tile, b_tile, h0)`` across the ranks of ``group`` (module docstring).

    Shards: ``jac``, ``rhs``, ``y`` are this rank's tile ``[B, L_r, d]``; ``h0`` ``[B, d]`` is read
    on the rank owning the first step of the recurrence. Forward: one ``all_gather`` of
    ``[4, B, d]``; backward: one ``all_gather`` of ``[3, B, d]``. Gradients:
    ``∂L/∂rhs = μ``, ``∂L/∂jac_t = μ_t y_{t∓1}``, ``∂L/∂h0 = a_first μ_first`` (origin rank only,
    zeros elsewhere) with ``μ`` the adjoint of the *global* loss (the sum of every rank's loss).
    """

    @staticmethod
    def forward(
        ctx: Any,
        jac: Tensor,
        rhs: Tensor,
        h0: Tensor | None,
        group: ProcessGroup | None,
        reverse: bool,
        backend: str,
    ) -> Tensor:
        rank, world = group_rank(group), group_size(group)
        order, pos = _direction(rank, world, reverse)
        acc = compute_dtype(rhs.dtype)
        a = _flip_if(jac.to(acc), reverse)
        b = _flip_if(rhs.to(acc), reverse)
        h0_acc = None if h0 is None or pos != 0 else h0.to(acc)
        y, carry, gathered = _chain_scan(a, b, h0_acc, order, pos, group, backend, True)
        # a_{e_r}: the first multiplier (in the recurrence's direction) of the next tile.
        a_next = gathered[order[pos + 1]][2] if pos + 1 < world else torch.zeros_like(carry)
        ctx.save_for_backward(a, y, carry, a_next)
        ctx.group, ctx.reverse, ctx.backend = group, reverse, backend
        ctx.has_h0, ctx.order, ctx.pos = h0 is not None, order, pos
        ctx.dtypes = (jac.dtype, rhs.dtype, None if h0 is None else h0.dtype)
        return _flip_if(y, reverse).to(rhs.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_y: Tensor) -> tuple[Tensor | None, ...]:
        a, y, carry, a_next = ctx.saved_tensors
        order: list[int] = ctx.order
        pos: int = ctx.pos
        g = _flip_if(grad_y.to(a.dtype), ctx.reverse)
        alpha = torch.cat([a[:, 1:], a_next.unsqueeze(1)], dim=1)
        # The adjoint runs against the recurrence: mirror time and the rank order, then chain.
        mu_mirrored, _, _ = _chain_scan(
            alpha.flip(1),
            g.flip(1),
            None,
            order[::-1],
            len(order) - 1 - pos,
            ctx.group,
            ctx.backend,
            False,
        )
        mu = mu_mirrored.flip(1)
        prev = torch.cat([carry.unsqueeze(1), y[:, :-1]], dim=1)
        grad_jac = _flip_if(mu * prev, ctx.reverse).to(ctx.dtypes[0])
        grad_rhs = _flip_if(mu, ctx.reverse).to(ctx.dtypes[1])
        grad_h0 = None
        if ctx.has_h0 and ctx.needs_input_grad[2]:
            first = a[:, 0] * mu[:, 0] if pos == 0 else torch.zeros_like(carry)
            grad_h0 = first.to(ctx.dtypes[2])
        return grad_jac, grad_rhs, grad_h0, None, None, None


def _local_tile_error(jac: object, rhs: object, h0: object, suffix: str = "_local") -> str | None:
    """This rank's own input problems (None when fine); names the arguments with ``suffix``."""
    j, r = f"jac{suffix}", f"rhs{suffix}"
    if not isinstance(jac, Tensor):
        return f"{j} must be a torch.Tensor, got {type(jac).__name__}"
    if not isinstance(rhs, Tensor):
        return f"{r} must be a torch.Tensor, got {type(rhs).__name__}"
    if rhs.dim() != 3:
        return f"{r} must be [B, L, d] (3 dimensions), got shape {tuple(rhs.shape)}"
    if jac.shape != rhs.shape:
        return f"{j} must have {r}'s shape {tuple(rhs.shape)}, got {tuple(jac.shape)}"
    if rhs.dtype not in DTYPE_CODES:
        return f"{r} must be float64, float32, float16 or bfloat16, got {rhs.dtype}"
    if jac.dtype != rhs.dtype:
        return f"{j} must have {r}'s dtype {rhs.dtype}, got {jac.dtype}"
    if jac.device != rhs.device:
        return f"{j} must be on {r}'s device {rhs.device}, got {jac.device}"
    if rhs.shape[0] == 0 or rhs.shape[2] == 0:
        return f"{r} must have B >= 1 and d >= 1, got shape {tuple(rhs.shape)}"
    if rhs.shape[1] == 0:
        return f"{r} holds no time step (L = {r}.shape[1] = 0); every rank needs at least one"
    if h0 is not None:
        if not isinstance(h0, Tensor):
            return f"h0 must be a torch.Tensor or None, got {type(h0).__name__}"
        expected = (rhs.shape[0], rhs.shape[2])
        if tuple(h0.shape) != expected:
            return f"h0 must have shape [B, d] = {expected}, got {tuple(h0.shape)}"
        if h0.dtype != rhs.dtype or h0.device != rhs.device:
            return (
                f"h0 must match {r}'s dtype and device ({rhs.dtype}, {rhs.device}), got "
                f"({h0.dtype}, {h0.device})"
            )
    return None


def scan_diag_context_parallel(
    jac_local: Tensor,
    rhs_local: Tensor,
    h0: Tensor | None = None,
    group: ProcessGroup | None = None,
    *,
    reverse: bool = False,
    backend: str = "auto",
) -> Tensor:
    """The diagonal scan ``y_t = a_t ⊙ y_{t-1} + b_t`` with time split over the ranks of ``group``.

    Each rank passes its own tile -- usually ``[start, end) = time_shard_bounds(T, rank, N)`` of
    the full sequence, but any contiguous tiles in rank order work (lengths may differ) -- and gets
    back the exact states of that tile, as if one device had scanned the whole sequence.

    Shards (rank r, tile length ``L_r``):
        jac_local: ``[B, L_r, d]`` this rank's ``a_t``.
        rhs_local: ``[B, L_r, d]`` this rank's ``b_t``.
        h0: ``[B, d]`` the state before step 0; read on rank 0 only (rank N-1 with
            ``reverse=True``), ignored elsewhere (other ranks may pass None). None means zeros.

    Collectives per call: forward one ``all_gather`` of ``[N, 4, B, d]`` (the tile monoids,
    each tile's first multiplier and h0), after one ``all_gather`` of ``[N, 4]`` int64
    (``ok, B, d, dtype``) that checks the tiles agree; backward one ``all_gather`` of
    ``[N, 3, B, d]`` (the reverse monoids).

    Gradient (the module docstring derives it): ``μ_t = g_t + a_{t+1} μ_{t+1}`` over the *whole*
    sequence, ``∂L/∂rhs = μ``, ``∂L/∂jac_t = μ_t y_{t-1}``, ``∂L/∂h0 = a_0 μ_0`` on rank 0 (zeros
    on the others). ``L`` is the sum of the ranks' losses: each rank back-propagates its own.

    Args:
        jac_local, rhs_local, h0: see Shards.
        group: the context-parallel process group (None: the default group).
        reverse: run ``y_t = a_t ⊙ y_{t+1} + b_t`` from the last step (``y_T = h0``).
        backend: the local scan's backend (``"auto"``, ``"triton"``, ``"eager"``).

    Returns:
        ``[B, L_r, d]`` this rank's states, in ``rhs_local``'s dtype (accumulated in float32, or
        float64 for float64 inputs).

    Raises:
        RuntimeError: the process group is not initialised.
        ValueError: bad local input (shape, dtype, empty tile), on the rank that has it and -- via
            the shape check -- on every other rank too; B, d or dtype differing between ranks.

    Example (two ranks, ``torchrun --nproc_per_node=2``)::

        start, end = time_shard_bounds(T, rank, 2)
        y_local = scan_diag_context_parallel(jac[:, start:end], rhs[:, start:end])
    """
    require_initialized("scan_diag_context_parallel")
    error = _local_tile_error(jac_local, rhs_local, h0)
    dims = (
        [0, 0, 0]
        if error
        else [rhs_local.shape[0], rhs_local.shape[2], DTYPE_CODES[rhs_local.dtype]]
    )
    agree_across_ranks("scan_diag_context_parallel", error, dims, ["B", "d", _DTYPE_NAMES], group)
    out: Tensor = _ContextParallelScanFunction.apply(
        jac_local, rhs_local, h0, group, reverse, backend
    )
    return out


# ----------------------------------------------------------------------------------------------
# The "context_parallel" scan backend
# ----------------------------------------------------------------------------------------------


class ContextParallelScan:
    """pararnn-core's scan backend ``"context_parallel"``: shard a replicated trajectory in time.

    Newton (and its eq. 2.6 backward) calls ``backend(jac, rhs, h0, reverse=, structure=)`` with
    the *full* trajectory, identical on every rank of ``group``. This backend takes its tile
    ``time_shard_bounds(T, rank, N)``, runs the context-parallel protocol on it (no autograd: the
    Newton Function differentiates analytically), and all-gathers the tiles so every rank returns
    the full ``[B, T, D]``.

    Shards: ``jac``, ``rhs``, result ``[B, T, D]`` replicated; inside, tile ``[B, L_r, D]``.
    Collectives per call: one ``all_gather`` ``[N, 5]`` int64 (``ok``; B, T, D and dtype
    agree), one ``all_gather`` ``[N, 4, B, D]`` (monoids), one ``all_gather``
    ``[N, B, ceil(T/N), D]`` (the tiles, padded to the longest).

    Structures: ``Diag`` only (GRU-type cells). ``Block``/``Dense`` raise ``NotImplementedError``.

    Args:
        group: the process group (None: the default group, looked up at call time).
        backend: the local scan's backend.
    """

    def __init__(self, group: ProcessGroup | None = None, backend: str = "auto") -> None:
        self.group = group
        self.backend = backend

    def __call__(
        self,
        jac: Tensor,
        rhs: Tensor,
        h0: Tensor | None,
        *,
        reverse: bool,
        structure: Structure,
    ) -> Tensor:
        if isinstance(structure, Block | Dense):
            raise NotImplementedError(
                f"scan_backend='context_parallel' supports structure Diag() only, got "
                f"{structure!r}; use scan_backend='auto' for block and dense cells"
            )
        if not isinstance(structure, Diag):
            raise TypeError(f"structure must be Diag(), Block(k) or Dense(), got {structure!r}")
        require_initialized("scan_backend='context_parallel'")
        group = self.group
        rank, world = group_rank(group), group_size(group)
        error = _local_tile_error(jac, rhs, h0, "")
        steps = 0 if error else rhs.shape[1]
        if error is None and steps < world:
            error = (
                f"scan_backend='context_parallel': T = {steps} time steps cannot be split over "
                f"world = {world} ranks (T >= world needed)"
            )
        dims = [0] * 4 if error else [*rhs.shape, DTYPE_CODES[rhs.dtype]]
        agree_across_ranks(
            "scan_backend='context_parallel'", error, dims, ["B", "T", "D", _DTYPE_NAMES], group
        )
        start, end = time_shard_bounds(steps, rank, world)
        order, pos = _direction(rank, world, reverse)
        acc = compute_dtype(rhs.dtype)
        with torch.no_grad():
            a = _flip_if(jac[:, start:end].to(acc), reverse)
            b = _flip_if(rhs[:, start:end].to(acc), reverse)
            h0_acc = None if h0 is None else h0.to(acc)
            y, _, _ = _chain_scan(a, b, h0_acc, order, pos, group, self.backend, True)
            tile = _flip_if(y, reverse).to(rhs.dtype)
            longest = time_shard_bounds(steps, 0, world)
            width = longest[1] - longest[0]
            padded = rhs.new_zeros(rhs.shape[0], width, rhs.shape[2])
            padded[:, : end - start] = tile
            tiles = [torch.empty_like(padded) for _ in range(world)]
            dist.all_gather(tiles, padded.contiguous(), group=group)
            parts = []
            for q, part in enumerate(tiles):
                s, e = time_shard_bounds(steps, q, world)
                parts.append(part[:, : e - s])
            return torch.cat(parts, dim=1)

    def __repr__(self) -> str:
        return f"ContextParallelScan(group={self.group!r}, backend={self.backend!r})"


#: The instance the entry point ``pararnn.scan_backends: context_parallel`` loads (default group).
context_parallel_scan = ContextParallelScan()


# ----------------------------------------------------------------------------------------------
# Two virtual ranks on one device
# ----------------------------------------------------------------------------------------------


def scan_diag_two_ranks(
    jac: Tensor, rhs: Tensor, h0: Tensor | None = None, *, backend: str = "auto"
) -> Tensor:
    """The context-parallel protocol with two *virtual* ranks: two CUDA streams of one device.

    The sequence is split by ``time_shard_bounds(T, r, 2)``; each half is scanned from zero on its
    own stream (the two local scans overlap), the "all_gather" is the exchange of the two tile
    monoids ``(P_end, y_end)`` ``[B, d]`` after an event wait, and the second half is corrected by
    ``P_t ⊙ carry``. A test vehicle for the protocol without a process group; not differentiable.

    Args:
        jac, rhs: ``[B, T, d]`` CUDA tensors, ``T >= 2``.
        h0: ``[B, d]`` or None (zeros).
        backend: the local scans' backend.

    Returns:
        ``[B, T, d]`` states in rhs's dtype, equal to ``scan_diag(jac, rhs, h0)``.

    Raises:
        ValueError: not CUDA tensors, shapes that differ, or ``T < 2``.
    """
    error = _local_tile_error(jac, rhs, h0, "")
    if error is not None:
        raise ValueError(error)
    if rhs.device.type != "cuda":
        raise ValueError(f"scan_diag_two_ranks needs CUDA tensors, got device {rhs.device}")
    steps = rhs.shape[1]
    bounds = [time_shard_bounds(steps, r, 2) for r in range(2)]
    acc = compute_dtype(rhs.dtype)
    main = torch.cuda.current_stream(rhs.device)
    streams = [torch.cuda.Stream(rhs.device) for _ in range(2)]  # type: ignore[no-untyped-call]
    partial: list[tuple[Tensor, Tensor]] = []
    done = []
    with torch.no_grad():
        for (start, end), stream in zip(bounds, streams, strict=True):
            stream.wait_stream(main)
            with torch.cuda.stream(stream):
                a = jac[:, start:end].to(acc)
                z = scan_diag(a, rhs[:, start:end].to(acc), None, backend=backend)
                partial.append((z, torch.cumprod(a, dim=1)))
                event = torch.cuda.Event()  # type: ignore[no-untyped-call]
                event.record(stream)
                done.append(event)
        for event in done:
            main.wait_event(event)
        for z, prod in partial:
            # Allocated on a side stream, consumed on the main one: keep the allocator from
            # handing the memory back to the side stream while main still reads it.
            z.record_stream(main)
            prod.record_stream(main)
        carry = torch.zeros_like(partial[0][0][:, 0]) if h0 is None else h0.to(acc)
        out = []
        for z, prod in partial:
            out.append(z + prod * carry.unsqueeze(1))
            carry = prod[:, -1] * carry + z[:, -1]
        return torch.cat(out, dim=1).to(rhs.dtype)
