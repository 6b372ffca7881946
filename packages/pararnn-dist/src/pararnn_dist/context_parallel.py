"""Context parallel along time: each rank holds a contiguous tile of the steps of a diagonal or
block-diagonal linear recurrence and the ranks stitch their tiles together with one collective
(DESIGN §3).

Why this file exists: a sequence too long for one device (or one Newton scan too slow on one)
is split along T. The recurrence ``y_t = a_t ⊙ y_{t-1} + b_t`` is a prefix product of the pairs
``(a_t, b_t)`` under ``(a2, b2)∘(a1, b1) = (a2 a1, a2 b1 + b2)``, so a tile is summarised by one
pair of shape ``[B, d]`` -- its *monoid* ``(P_end, y_end)`` with ``P_end = Π_{t in tile} a_t`` and
``y_end`` the tile's last state when scanned from zero. A block-diagonal recurrence
``y_t = A_t @ y_{t-1} + b_t`` (one ``k x k`` block per channel) is the same monoid with matrix
products: ``P_end = A_{e-1} ··· A_s`` ``[B, d, k, k]``, states ``[B, d, k]``; the only places the
two differ are gathered in ``_TileAlgebra``.

Protocol (forward, rank r of N, tile ``[s_r, e_r) = time_shard_bounds(T, r, N)``):

1. local: ``z = scan_diag(a_tile, b_tile, 0)`` and ``P_t = Π_{s_r ≤ τ ≤ t} a_τ`` (cumprod;
   block: ``scan_block_diag`` and only ``P_end``, by pairwise products);
2. **one** ``all_gather`` of ``(P_end, y_end, a_first, h0)`` packed into one flat buffer
   (``4·B·d`` elements; block ``B·d·k·(2k + 2)``) (``a_first = a_{s_r}``, needed by the
   backward of rank r-1; ``h0`` is read from rank 0);
3. carry ``c_r = ((P_{r-1}, y_{r-1}) ∘ ... ∘ (P_0, y_0)) · h0`` (the exclusive prefix over ranks
   ``< r`` applied to ``h0``), computed redundantly on every rank from the gathered monoids;
4. local: ``y_t = z_t + P_t ⊙ c_r`` (block: the tile is re-scanned from ``c_r`` instead, which
   is exact and stores no ``[B, L, d, k, k]`` prefix products).

Backward (the mirrored protocol): with ``g = ∂L/∂y`` on each rank's tile, the adjoint is the
reverse recurrence ``μ_t = g_t + a_{t+1} μ_{t+1}`` (``μ_{T-1} = g_{T-1}``; block:
``μ_t = g_t + A_{t+1}ᵀ μ_{t+1}``). Rank r scans its tile backwards from zero with the shifted multipliers ``α_t = a_{t+1}`` -- the last one is
``a_{e_r} = a_first`` of rank r+1, taken from the forward's gather -- and **one** ``all_gather`` of
the reverse monoids ``(Q_start, ν_start)`` gives every rank its carry from the right in one
collective (not a rank-by-rank chain). Then ``∂L/∂b = μ``, ``∂L/∂a_t = μ_t ⊙ y_{t-1}`` (with
``y_{s_r - 1} = c_r``) and, on rank 0, ``∂L/∂h0 = a_0 ⊙ μ_0`` (block: the multipliers are
transposed, ``∂L/∂A_t = μ_t y_{t-1}ᵀ`` and ``∂L/∂h0 = A_0ᵀ μ_0``).

``reverse=True`` runs the same algebra with time and the rank order mirrored: the recurrence is
``y_t = a_t ⊙ y_{t+1} + b_t`` with ``y_T = h0`` read from the last rank.

Contents: :func:`time_shard_bounds`, :func:`scan_diag_context_parallel` and
:func:`scan_block_diag_context_parallel` (differentiable),
:class:`ContextParallelScan` / :data:`context_parallel_scan` (the ``"context_parallel"`` scan
backend of pararnn-core, loaded through the entry-point group ``pararnn.scan_backends``) and
:func:`scan_diag_two_ranks` (the protocol on two CUDA streams of one device).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.autograd.function import once_differentiable
from torch.distributed import ProcessGroup

from pararnn_core import Block, Dense, Diag, Structure
from pararnn_kernels import scan_block_diag, scan_diag
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
    "scan_block_diag_context_parallel",
    "scan_diag_context_parallel",
    "scan_diag_two_ranks",
    "time_shard_bounds",
]

_DTYPE_NAMES = "dtype code (1=float64, 2=float32, 3=float16, 4=bfloat16)"
_K_NAME = "k (block size; 0 for a diagonal scan)"


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
# The tile algebra: the only place diagonal and block-diagonal recurrences differ
# ----------------------------------------------------------------------------------------------


def _block_product(a: Tensor) -> Tensor:
    """``A_{L-1} ··· A_1 A_0`` of ``a [B, L, d, k, k]`` -> ``[B, d, k, k]``, by pairwise halving.

    Later steps multiply from the left; an odd last block waits for the next round unchanged.
    """
    while a.shape[1] > 1:
        even = a.shape[1] - a.shape[1] % 2
        pairs = a[:, 1:even:2] @ a[:, 0:even:2]
        a = torch.cat([pairs, a[:, even:]], dim=1)
    return a[:, 0]


class _TileAlgebra:
    """The monoid of one structure, so that the chain and the Function below are written once.

    Diagonal: multipliers ``a [B, L, d]``, states ``[B, d]``; the tile's states are corrected by
    the local ``cumprod(a) ⊙ carry``. Block (``block=True``): multipliers ``[B, L, d, k, k]``,
    states ``[B, d, k]``; the correction re-runs the local scan from the carry (exact, and no
    ``[B, L, d, k, k]`` prefix products are stored).
    """

    def __init__(self, block: bool, backend: str) -> None:
        self.block = block
        self.backend = backend

    def local(self, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        """The tile scanned from zero ``z``, its product ``P_end``, and what :meth:`correct` reuses."""
        if self.block:
            z = scan_block_diag(a, b, None, backend=self.backend)
            return z, _block_product(a), None
        z = scan_diag(a, b, None, backend=self.backend)
        prod = torch.cumprod(a, dim=1)
        return z, prod[:, -1], prod

    def correct(
        self, a: Tensor, b: Tensor, z: Tensor, prod: Tensor | None, carry: Tensor
    ) -> Tensor:
        """The tile's exact states given the state ``carry`` before its first step."""
        if self.block:
            return scan_block_diag(a, b, carry, backend=self.backend)
        assert prod is not None
        return z + prod * carry.unsqueeze(1)

    def apply(self, p: Tensor, state: Tensor) -> Tensor:
        """``P · state``: ``[B, d] ⊙ [B, d]`` or ``[B, d, k, k] @ [B, d, k]``."""
        if self.block:
            return (p @ state.unsqueeze(-1)).squeeze(-1)
        return p * state

    def transpose(self, a: Tensor) -> Tensor:
        """``Aᵀ`` per channel (the identity for diagonal multipliers)."""
        return a.transpose(-1, -2) if self.block else a

    def outer(self, mu: Tensor, prev: Tensor) -> Tensor:
        """``∂L/∂A_t = μ_t y_{t-1}ᵀ`` (``μ_t ⊙ y_{t-1}`` for diagonal multipliers)."""
        if self.block:
            return mu.unsqueeze(-1) * prev.unsqueeze(-2)
        return mu * prev


# ----------------------------------------------------------------------------------------------
# The chain: one tile of a recurrence running along increasing time, ranks in `order`
# ----------------------------------------------------------------------------------------------


def _exclusive_carry(
    algebra: _TileAlgebra, monoids: Sequence[tuple[Tensor, Tensor]], start: Tensor
) -> Tensor:
    """``((P_{n-1}, y_{n-1}) ∘ ... ∘ (P_0, y_0)) · start``: the state after the tiles ``monoids``
    (in the recurrence's order), entered with ``start``."""
    carry = start
    for p_end, y_end in monoids:
        carry = algebra.apply(p_end, carry) + y_end
    return carry


def _pack(slots: Sequence[Tensor]) -> Tensor:
    return torch.cat([s.reshape(-1) for s in slots])


def _unpack(flat: Tensor, like: Sequence[Tensor]) -> list[Tensor]:
    parts = torch.split(flat, [s.numel() for s in like])
    return [part.view_as(s) for part, s in zip(parts, like, strict=True)]


def _chain_scan(
    algebra: _TileAlgebra,
    a: Tensor,
    b: Tensor,
    h0: Tensor | None,
    order: list[int],
    pos: int,
    group: ProcessGroup | None,
    exchange_h0: bool,
) -> tuple[Tensor, Tensor, list[list[Tensor]]]:
    """Scan the tile ``a``, ``b`` (compute dtype) that sits at position ``pos`` of ``order``.

    ``order`` lists the ranks in the recurrence's direction: the state flows from ``order[0]``'s
    tile into ``order[1]``'s, and so on. One ``all_gather`` of the flat packing of
    ``(P_end, y_end, a_first, h0)`` (without h0 when not ``exchange_h0``; h0 is then zero).

    Returns:
        ``y`` (the exact states, ``b``'s shape), the carry (the state before the tile's first
        step) and every rank's gathered slots ``[P_end, y_end, a_first(, h0)]``, by group rank.
    """
    z, p_end, prod = algebra.local(a, b)
    zero_state = torch.zeros_like(z[:, 0])
    slots = [p_end, z[:, -1], a[:, 0]]
    if exchange_h0:
        slots.append(zero_state if h0 is None else h0)
    mine = _pack(slots)
    gathered_flat = [torch.empty_like(mine) for _ in range(len(order))]
    dist.all_gather(gathered_flat, mine, group=group)
    gathered = [_unpack(g, slots) for g in gathered_flat]
    start = gathered[order[0]][3].clone() if exchange_h0 else zero_state
    before = [(gathered[q][0], gathered[q][1]) for q in order[:pos]]
    carry = _exclusive_carry(algebra, before, start)
    return algebra.correct(a, b, z, prod, carry), carry, gathered


def _direction(rank: int, world: int, reverse: bool) -> tuple[list[int], int]:
    order = list(range(world - 1, -1, -1)) if reverse else list(range(world))
    return order, order.index(rank)


def _flip_if(x: Tensor, reverse: bool) -> Tensor:
    return x.flip(1) if reverse else x


class _ContextParallelScanFunction(torch.autograd.Function):
    """``y_tile = CP-scan(a_tile, b_tile, h0)`` across the ranks of ``group`` (module docstring).

    Shards (Diag / Block(k)): ``jac`` ``[B, L_r, d]`` / ``[B, L_r, d, k, k]``; ``rhs`` and ``y``
    ``[B, L_r, d]`` / ``[B, L_r, d, k]``, this rank's tile; ``h0`` ``[B, d]`` / ``[B, d, k]`` is
    read on the rank owning the first step of the recurrence. Forward: one ``all_gather`` of the
    packed ``(P_end, y_end, a_first, h0)``; backward: one ``all_gather`` of the packed reverse
    monoids ``(Q_start, ν_start, ·)``. Gradients: ``∂L/∂rhs = μ``, ``∂L/∂jac_t = μ_t y_{t∓1}ᵀ``,
    ``∂L/∂h0 = a_firstᵀ μ_first`` (origin rank only, zeros elsewhere) with ``μ`` the adjoint of
    the *global* loss (the sum of every rank's loss), ``μ_t = g_t + J_{t±1}ᵀ μ_{t±1}``.
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
        block: bool,
    ) -> Tensor:
        rank, world = group_rank(group), group_size(group)
        order, pos = _direction(rank, world, reverse)
        algebra = _TileAlgebra(block, backend)
        acc = compute_dtype(rhs.dtype)
        a = _flip_if(jac.to(acc), reverse)
        b = _flip_if(rhs.to(acc), reverse)
        h0_acc = None if h0 is None or pos != 0 else h0.to(acc)
        y, carry, gathered = _chain_scan(algebra, a, b, h0_acc, order, pos, group, True)
        # a_{e_r}: the first multiplier (in the recurrence's direction) of the next tile.
        a_next = gathered[order[pos + 1]][2] if pos + 1 < world else torch.zeros_like(a[:, 0])
        ctx.save_for_backward(a, y, carry, a_next)
        ctx.group, ctx.reverse, ctx.algebra = group, reverse, algebra
        ctx.has_h0, ctx.order, ctx.pos = h0 is not None, order, pos
        ctx.dtypes = (jac.dtype, rhs.dtype, None if h0 is None else h0.dtype)
        return _flip_if(y, reverse).to(rhs.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_y: Tensor) -> tuple[Tensor | None, ...]:
        a, y, carry, a_next = ctx.saved_tensors
        algebra: _TileAlgebra = ctx.algebra
        order: list[int] = ctx.order
        pos: int = ctx.pos
        g = _flip_if(grad_y.to(a.dtype), ctx.reverse)
        # The adjoint's multiplier at step t is J_{t+1}ᵀ: shifted by one, the last one taken from
        # the next tile, and transposed.
        alpha = algebra.transpose(torch.cat([a[:, 1:], a_next.unsqueeze(1)], dim=1))
        # The adjoint runs against the recurrence: mirror time and the rank order, then chain.
        mu_mirrored, _, _ = _chain_scan(
            algebra,
            alpha.flip(1),
            g.flip(1),
            None,
            order[::-1],
            len(order) - 1 - pos,
            ctx.group,
            False,
        )
        mu = mu_mirrored.flip(1)
        prev = torch.cat([carry.unsqueeze(1), y[:, :-1]], dim=1)
        grad_jac = _flip_if(algebra.outer(mu, prev), ctx.reverse).to(ctx.dtypes[0])
        grad_rhs = _flip_if(mu, ctx.reverse).to(ctx.dtypes[1])
        grad_h0 = None
        if ctx.has_h0 and ctx.needs_input_grad[2]:
            if pos == 0:
                first = algebra.apply(algebra.transpose(a[:, 0]), mu[:, 0])
            else:
                first = torch.zeros_like(carry)
            grad_h0 = first.to(ctx.dtypes[2])
        return grad_jac, grad_rhs, grad_h0, None, None, None, None


def _local_tile_error(
    jac: object, rhs: object, h0: object, suffix: str = "_local", *, block: bool = False
) -> str | None:
    """This rank's own input problems (None when fine); names the arguments with ``suffix``.

    Diagonal: ``jac``, ``rhs`` ``[B, L, d]``, ``h0`` ``[B, d]``. Block: ``jac`` ``[B, L, d, k, k]``,
    ``rhs`` ``[B, L, d, k]``, ``h0`` ``[B, d, k]``.
    """
    j, r = f"jac{suffix}", f"rhs{suffix}"
    if not isinstance(jac, Tensor):
        return f"{j} must be a torch.Tensor, got {type(jac).__name__}"
    if not isinstance(rhs, Tensor):
        return f"{r} must be a torch.Tensor, got {type(rhs).__name__}"
    layout, ndim = ("[B, L, d, k]", 4) if block else ("[B, L, d]", 3)
    if rhs.dim() != ndim:
        return f"{r} must be {layout} ({ndim} dimensions), got shape {tuple(rhs.shape)}"
    if block:
        expected = (*rhs.shape, rhs.shape[-1])
        if tuple(jac.shape) != expected:
            return (
                f"{j} must have shape [B, L, d, k, k] = {expected} (from {r}'s [B, L, d, k]), "
                f"got {tuple(jac.shape)}"
            )
    elif jac.shape != rhs.shape:
        return f"{j} must have {r}'s shape {tuple(rhs.shape)}, got {tuple(jac.shape)}"
    if rhs.dtype not in DTYPE_CODES:
        return f"{r} must be float64, float32, float16 or bfloat16, got {rhs.dtype}"
    if jac.dtype != rhs.dtype:
        return f"{j} must have {r}'s dtype {rhs.dtype}, got {jac.dtype}"
    if jac.device != rhs.device:
        return f"{j} must be on {r}'s device {rhs.device}, got {jac.device}"
    if any(size == 0 for i, size in enumerate(rhs.shape) if i != 1):
        sizes = "B >= 1, d >= 1 and k >= 1" if block else "B >= 1 and d >= 1"
        return f"{r} must have {sizes}, got shape {tuple(rhs.shape)}"
    if rhs.shape[1] == 0:
        return f"{r} holds no time step (L = {r}.shape[1] = 0); every rank needs at least one"
    if h0 is not None:
        if not isinstance(h0, Tensor):
            return f"h0 must be a torch.Tensor or None, got {type(h0).__name__}"
        state = (rhs.shape[0], *rhs.shape[2:])
        if tuple(h0.shape) != state:
            name = "[B, d, k]" if block else "[B, d]"
            return f"h0 must have shape {name} = {state}, got {tuple(h0.shape)}"
        if h0.dtype != rhs.dtype or h0.device != rhs.device:
            return (
                f"h0 must match {r}'s dtype and device ({rhs.dtype}, {rhs.device}), got "
                f"({h0.dtype}, {h0.device})"
            )
    return None


def _scan_context_parallel(
    what: str,
    jac_local: Tensor,
    rhs_local: Tensor,
    h0: Tensor | None,
    group: ProcessGroup | None,
    reverse: bool,
    backend: str,
    block: bool,
) -> Tensor:
    """Validate on every rank (one ``[N, 5]`` int64 ``all_gather``), then run the Function."""
    require_initialized(what)
    error = _local_tile_error(jac_local, rhs_local, h0, block=block)
    dims = (
        [0, 0, 0, 0]
        if error
        else [
            rhs_local.shape[0],
            rhs_local.shape[2],
            rhs_local.shape[3] if block else 0,
            DTYPE_CODES[rhs_local.dtype],
        ]
    )
    agree_across_ranks(what, error, dims, ["B", "d", _K_NAME, _DTYPE_NAMES], group)
    out: Tensor = _ContextParallelScanFunction.apply(
        jac_local, rhs_local, h0, group, reverse, backend, block
    )
    return out


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

    Collectives per call: forward one ``all_gather`` of ``[N, 4·B·d]`` (the packed tile monoids
    ``(P_end, y_end)``, each tile's first multiplier and h0), after one ``all_gather`` of
    ``[N, 5]`` int64 (``ok, B, d, k = 0, dtype``) that checks the tiles agree; backward one
    ``all_gather`` of ``[N, 3·B·d]`` (the reverse monoids).

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
    return _scan_context_parallel(
        "scan_diag_context_parallel", jac_local, rhs_local, h0, group, reverse, backend, False
    )


def scan_block_diag_context_parallel(
    jac_local: Tensor,
    rhs_local: Tensor,
    h0: Tensor | None = None,
    group: ProcessGroup | None = None,
    *,
    reverse: bool = False,
    backend: str = "auto",
) -> Tensor:
    """The block-diagonal scan ``y_t = A_t @ y_{t-1} + b_t`` (one ``k x k`` block per channel)
    with time split over the ranks of ``group``: :func:`scan_diag_context_parallel` for blocks.

    Shards (rank r, tile length ``L_r``):
        jac_local: ``[B, L_r, d, k, k]`` this rank's ``A_t``.
        rhs_local: ``[B, L_r, d, k]`` this rank's ``b_t``.
        h0: ``[B, d, k]`` the state before step 0; read on rank 0 only (rank N-1 with
            ``reverse=True``), ignored elsewhere. None means zeros.

    Protocol: the local ``scan_block_diag`` from zero gives ``y_end``; ``P_end = A_{e-1} ··· A_s``
    ``[B, d, k, k]`` is the tile's product (pairwise, log depth). Forward: one ``all_gather`` of
    ``[N, B·d·k·(2k + 2)]`` (the packed ``P_end``, ``y_end``, the first block ``A_s`` and h0)
    after one ``all_gather`` of ``[N, 5]`` int64 (``ok, B, d, k, dtype``); the exclusive prefix
    over the lower ranks applied to h0 is the carry ``c_r``, and the tile is re-scanned from
    ``c_r`` (exact, no prefix products stored). Backward: the adjoint
    ``μ_t = g_t + A_{t+1}ᵀ μ_{t+1}`` by the same protocol mirrored (multipliers shifted by one
    step, the last one the next rank's ``A_s``, and transposed), one ``all_gather`` of
    ``[N, B·d·k·(2k + 1)]``.

    Gradient: ``∂L/∂rhs = μ``, ``∂L/∂jac_t = μ_t y_{t-1}ᵀ`` (``[B, L_r, d, k, k]``),
    ``∂L/∂h0 = A_0ᵀ μ_0`` on rank 0 (zeros on the others); ``L`` is the sum of the ranks' losses.

    Args:
        jac_local, rhs_local, h0: see Shards.
        group: the context-parallel process group (None: the default group).
        reverse: run ``y_t = A_t @ y_{t+1} + b_t`` from the last step (``y_T = h0``).
        backend: the local scan's backend (``"auto"``, ``"triton"`` (k <= 4), ``"eager"``).

    Returns:
        ``[B, L_r, d, k]`` this rank's states in ``rhs_local``'s dtype.

    Raises:
        RuntimeError: the process group is not initialised.
        ValueError: bad local input on any rank (raised on every rank); B, d, k or dtype
            differing between ranks.

    Example (two ranks)::

        start, end = time_shard_bounds(T, rank, 2)
        y_local = scan_block_diag_context_parallel(jac[:, start:end], rhs[:, start:end], h0)
    """
    return _scan_context_parallel(
        "scan_block_diag_context_parallel", jac_local, rhs_local, h0, group, reverse, backend, True
    )


# ----------------------------------------------------------------------------------------------
# The "context_parallel" scan backend
# ----------------------------------------------------------------------------------------------


class ContextParallelScan:
    """pararnn-core's scan backend ``"context_parallel"``: shard a replicated trajectory in time.

    Newton (and its eq. 2.6 backward) calls ``backend(jac, rhs, h0, reverse=, structure=)`` with
    the *full* trajectory, identical on every rank of ``group``. This backend takes its tile
    ``time_shard_bounds(T, rank, N)``, runs the context-parallel protocol on it (no autograd: the
    Newton Function differentiates analytically), and all-gathers the tiles so every rank returns
    the full result.

    Shards: ``jac``, ``rhs``, result replicated (``[B, T, D]``; Block(k): ``jac``
    ``[B, T, D, k, k]``, ``rhs`` and result ``[B, T, D, k]``); inside, the tile ``[:, start:end]``.
    Collectives per call: one ``all_gather`` ``[N, 6]`` int64 (``ok``; B, T, D, k and dtype
    agree), one ``all_gather`` of the packed monoids, one ``all_gather`` of the tiles padded to
    the longest, ``ceil(T/N)`` steps.

    Structures: ``Diag()`` (GRU-type cells) and ``Block(k)`` (ParaLSTM, ParaSLSTM).
    ``Dense()`` raises ``NotImplementedError`` before any collective.

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
        if isinstance(structure, Dense):
            raise NotImplementedError(
                f"scan_backend='context_parallel' supports structures Diag() and Block(k), got "
                f"{structure!r}; use scan_backend='auto' for dense cells"
            )
        if not isinstance(structure, Diag | Block):
            raise TypeError(f"structure must be Diag(), Block(k) or Dense(), got {structure!r}")
        require_initialized("scan_backend='context_parallel'")
        group = self.group
        rank, world = group_rank(group), group_size(group)
        block = isinstance(structure, Block)
        error = _local_tile_error(jac, rhs, h0, "", block=block)
        if error is None and isinstance(structure, Block) and rhs.shape[-1] != structure.k:
            error = (
                f"rhs must be [B, T, D, k] with k = {structure.k} for {structure!r}, got shape "
                f"{tuple(rhs.shape)}"
            )
        steps = 0 if error else rhs.shape[1]
        if error is None and steps < world:
            error = (
                f"scan_backend='context_parallel': T = {steps} time steps cannot be split over "
                f"world = {world} ranks (T >= world needed)"
            )
        k = rhs.shape[3] if block and error is None else 0
        dims = [0] * 5 if error else [*rhs.shape[:3], k, DTYPE_CODES[rhs.dtype]]
        agree_across_ranks(
            "scan_backend='context_parallel'",
            error,
            dims,
            ["B", "T", "D", _K_NAME, _DTYPE_NAMES],
            group,
        )
        start, end = time_shard_bounds(steps, rank, world)
        order, pos = _direction(rank, world, reverse)
        algebra = _TileAlgebra(block, self.backend)
        acc = compute_dtype(rhs.dtype)
        with torch.no_grad():
            a = _flip_if(jac[:, start:end].to(acc), reverse)
            b = _flip_if(rhs[:, start:end].to(acc), reverse)
            h0_acc = None if h0 is None else h0.to(acc)
            y, _, _ = _chain_scan(algebra, a, b, h0_acc, order, pos, group, True)
            tile = _flip_if(y, reverse).to(rhs.dtype)
            longest = time_shard_bounds(steps, 0, world)
            width = longest[1] - longest[0]
            padded = rhs.new_zeros(rhs.shape[0], width, *rhs.shape[2:])
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
