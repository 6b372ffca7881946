"""Triton kernels of the linear-recurrence scans (kernel-only module: no types, no public API).

Conventions shared by every kernel here:

* Tensors are contiguous: diagonal ``[B, T, D]``; block ``jac [B, T, D, K, K]``, ``rhs [B, T, D, K]``.
* A program walks *processing positions* ``p`` (0 = the first step the recurrence consumes); the
  time index is ``t = p`` forward and ``t = T - 1 - p`` when ``REVERSE``. Chunks of ``BLOCK_T``
  positions are loaded as tiles and scanned with ``tl.associative_scan`` under the pair monoid
  ``(a2, b2)∘(a1, b1) = (a2 a1, a2 b1 + b2)``; the carry (the exact state before the chunk) is
  applied afterwards, so any length runs with no cap.
* ``SHIFT`` (the adjoint): the multiplier of position ``p`` is the jac of position ``p - 1``.
  ``TRANSPOSE`` (block adjoint): the multiplier is ``Aᵀ``.
* ``GRAD_JAC`` (the adjoint): also write ``∂L/∂jac`` = the adjoint times the state the *original*
  recurrence consumed at that step, which sits one processing position later (h0 past the end).
* Padded rows (past the segment end) get multiplier 1 (identity) and offset 0, so the last row of
  a scanned tile is the state at the chunk's last valid step.
* Accumulation is float32 whatever the storage dtype.
"""

import triton
import triton.language as tl


@triton.jit
def _combine_diag(a_left, b_left, a_right, b_right):
    # `left` is the earlier element in processing order.
    return a_right * a_left, a_right * b_left + b_right


@triton.jit
def _last_row(x, BLOCK_T: tl.constexpr):
    rows = tl.arange(0, BLOCK_T)
    return tl.sum(tl.where((rows == BLOCK_T - 1)[:, None], x, 0.0), axis=0)


@triton.jit
def _time_index(p, T, REVERSE: tl.constexpr):
    if REVERSE:
        return T - 1 - p
    else:
        return p


@triton.jit
def _load_tile_row(jac_ptr, rhs_ptr, base, rel, p, valid, mask_d, step_d, SHIFT: tl.constexpr):
    """Multipliers and offsets of ``[ROWS, BLOCK_D]`` steps: ``rel`` their int32 offsets from the
    64-bit scalar ``base``, ``p`` ``[ROWS]`` their processing positions, ``valid`` ``[ROWS]``
    whether they are inside the sequence, ``step_d`` the offset of the next processing
    position. The multiplier of a padded row is 1 (identity), its offset 0."""
    mask = valid[:, None] & mask_d[None, :]
    b = tl.load(rhs_ptr + base + rel, mask=mask, other=0.0).to(tl.float32)
    # SHIFT (the adjoint): the multiplier at position p is jac at position p - 1.
    a = tl.load(
        jac_ptr + (base - SHIFT * step_d) + rel, mask=mask & (p >= SHIFT)[:, None], other=0.0
    ).to(tl.float32)
    a = tl.where(valid[:, None], a, 1.0)
    return a, b, mask


@triton.jit
def _consumed_row(prev_ptr, base, rel, p, mask, T, step_d, h0, HAS_H0: tl.constexpr):
    """The state the *original* recurrence consumed at positions ``p`` of the adjoint scan: its
    output one processing position later, h0 past the end (zero without h0). Addressing as in
    :func:`_load_tile_row`."""
    prev = tl.load(
        prev_ptr + (base + step_d) + rel, mask=mask & (p + 1 < T)[:, None], other=0.0
    ).to(tl.float32)
    if HAS_H0:
        prev = tl.where((p + 1 == T)[:, None], h0[None, :], prev)
    return prev


@triton.jit
def _initial_state(h0_ptr, pid_b, D, offs_d, mask_d, HAS_H0: tl.constexpr, BLOCK_D: tl.constexpr):
    """Batch row ``pid_b``'s h0 on the channels ``offs_d`` as float32 (zero without h0)."""
    h0 = tl.zeros([BLOCK_D], dtype=tl.float32)
    if HAS_H0:
        h0 = tl.load(h0_ptr + pid_b.to(tl.int64) * D + offs_d, mask=mask_d, other=0.0)
        h0 = h0.to(tl.float32)
    return h0


@triton.jit
def _load_diag_chunk(
    jac_ptr,
    rhs_ptr,
    row_base,
    p,
    seg_end,
    T,
    D,
    offs_d,
    mask_d,
    REVERSE: tl.constexpr,
    SHIFT: tl.constexpr,
):
    valid = p < seg_end
    t = _time_index(p, T, REVERSE)
    t_jac = _time_index(p - SHIFT, T, REVERSE)
    mask = valid[:, None] & mask_d[None, :]
    offs = row_base + t[:, None].to(tl.int64) * D + offs_d[None, :]
    offs_jac = row_base + t_jac[:, None].to(tl.int64) * D + offs_d[None, :]
    a = tl.load(jac_ptr + offs_jac, mask=mask & (p >= SHIFT)[:, None], other=0.0).to(tl.float32)
    b = tl.load(rhs_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    a = tl.where(valid[:, None], a, 1.0)
    return a, b, offs, mask


@triton.jit
def _consumed_state(
    prev_ptr, row_base, p, mask, T, D, offs_d, h0, REVERSE: tl.constexpr, HAS_H0: tl.constexpr
):
    """The state the *original* recurrence consumed at positions ``p`` of the adjoint scan: its
    output one processing position later, h0 past the end (zero without h0)."""
    p_next = p + 1
    t_next = _time_index(p_next, T, REVERSE)
    offs_prev = row_base + t_next[:, None].to(tl.int64) * D + offs_d[None, :]
    prev = tl.load(prev_ptr + offs_prev, mask=mask & (p_next < T)[:, None], other=0.0)
    prev = prev.to(tl.float32)
    if HAS_H0:
        prev = tl.where((p_next == T)[:, None], h0[None, :], prev)
    return prev


@triton.jit
def scan_diag_kernel(
    jac_ptr,
    rhs_ptr,
    h0_ptr,
    out_ptr,
    prev_ptr,
    grad_jac_ptr,
    T,
    D,
    HAS_H0: tl.constexpr,
    REVERSE: tl.constexpr,
    SHIFT: tl.constexpr,
    GRAD_JAC: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
    VEC: tl.constexpr,
):
    """Grid (cdiv(D, BLOCK_D), B): one program walks the whole sequence of one channel block.

    Forward (GRAD_JAC=False): the carry starts from h0 when HAS_H0, else zero.
    Adjoint (SHIFT=GRAD_JAC=True): the carry starts from zero; h0 is the original recurrence's
    initial state, used for ∂L/∂jac at the boundary.
    At most VEC channels per thread: with BLOCK_D = 32 * VEC * num_warps every thread holds
    whole columns of the chunk, and the scan along time runs sequentially inside the thread with
    no exchange between threads. (Per-element 64-bit addresses, as here, measured faster in this
    loop than a scalar base with 32-bit offsets: docs/benchmarks.md.)
    """
    pid_d = tl.program_id(0)
    pid_b = tl.program_id(1)
    offs_d = tl.max_contiguous(pid_d * BLOCK_D + tl.arange(0, BLOCK_D), VEC)
    mask_d = offs_d < D
    row_base = pid_b.to(tl.int64) * T * D

    h0 = _initial_state(h0_ptr, pid_b, D, offs_d, mask_d, HAS_H0, BLOCK_D)
    carry = tl.zeros([BLOCK_D], dtype=tl.float32)
    if not GRAD_JAC:
        carry = h0

    # Software pipelining by hand: the next chunk's loads are in flight while this one is
    # scanned (the last prefetch is fully masked and moves no memory).
    p = tl.arange(0, BLOCK_T)
    a_next, b_next, offs_next, mask_next = _load_diag_chunk(
        jac_ptr, rhs_ptr, row_base, p, T, T, D, offs_d, mask_d, REVERSE, SHIFT
    )
    for c0 in range(0, T, BLOCK_T):
        a, b, offs, mask = a_next, b_next, offs_next, mask_next
        p = c0 + tl.arange(0, BLOCK_T)
        a_next, b_next, offs_next, mask_next = _load_diag_chunk(
            jac_ptr, rhs_ptr, row_base, p + BLOCK_T, T, T, D, offs_d, mask_d, REVERSE, SHIFT
        )
        if GRAD_JAC:
            prev = _consumed_state(prev_ptr, row_base, p, mask, T, D, offs_d, h0, REVERSE, HAS_H0)
        prod, acc = tl.associative_scan((a, b), 0, _combine_diag)
        y = acc + prod * carry[None, :]
        tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)
        if GRAD_JAC:
            tl.store(grad_jac_ptr + offs, (y * prev).to(grad_jac_ptr.dtype.element_ty), mask=mask)
        carry = _last_row(y, BLOCK_T)


@triton.jit
def scan_diag_streamed_kernel(
    jac_desc,
    rhs_desc,
    out_desc,
    h0_ptr,
    T,
    D,
    HAS_H0: tl.constexpr,
    REVERSE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
    STAGES: tl.constexpr,
):
    """Grid (cdiv(D, BLOCK_D), B): scan_diag_kernel's walk, its chunks moved by the tensor
    memory accelerator (TMA, compute capability >= 9.0); forward passes only (the launcher
    gives adjoint passes another plan).

    The ``*_desc`` arguments are tensor descriptors of the ``[B, T, D]`` tensors with blocks of
    ``[1, BLOCK_T, BLOCK_D]``. Triton pipelines the loop's descriptor loads over STAGES buffers
    in shared memory, so STAGES chunks are in flight per program without costing registers:
    narrow programs (32 channels) still keep enough bytes moving. A chunk is loaded in time
    order, the reverse direction scanned by a reverse associative scan; rows past the sequence
    read as zeros (the hardware's fill; the reverse pass multiplies them by 1) and are never
    stored (the hardware clips), and the carry is picked from the last row inside it.
    """
    pid_d = tl.program_id(0)
    pid_b = tl.program_id(1)
    d0 = pid_d * BLOCK_D
    offs_d = d0 + tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    rows = tl.arange(0, BLOCK_T)
    carry = _initial_state(h0_ptr, pid_b, D, offs_d, mask_d, HAS_H0, BLOCK_D)
    # Chunks start at multiples of BLOCK_T in both directions: a box at a negative time stopped
    # an H200 with an illegal instruction (reverse, T = 1), so only the last chunk in time
    # reaches past the sequence, never the first.
    top = (tl.cdiv(T, BLOCK_T) - 1) * BLOCK_T
    for c0 in tl.range(0, T, BLOCK_T, num_stages=STAGES):
        # `t_lo` is the time of the chunk's row 0.
        if REVERSE:
            t_lo = top - c0
            # Processing order runs from the last row to the first, so the rows past the end
            # come first: they multiply by 1 (not the fill's 0) to hand the carry through.
            last = 0
        else:
            t_lo = c0
            last = tl.minimum(T - c0, BLOCK_T) - 1
        a = jac_desc.load([pid_b, t_lo, d0]).reshape(BLOCK_T, BLOCK_D)
        if REVERSE:
            a = tl.where((t_lo + rows < T)[:, None], a, 1.0)
        b = rhs_desc.load([pid_b, t_lo, d0]).reshape(BLOCK_T, BLOCK_D)
        prod, acc = tl.associative_scan(
            (a.to(tl.float32), b.to(tl.float32)), 0, _combine_diag, reverse=REVERSE
        )
        y = acc + prod * carry[None, :]
        out_desc.store([pid_b, t_lo, d0], y.to(out_desc.dtype).reshape(1, BLOCK_T, BLOCK_D))
        carry = tl.sum(tl.where((rows == last)[:, None], y, 0.0), axis=0)


# ----------------------------------------------------------------------------------------------
# Diagonal scan in one pass with decoupled look-back.
#
# Every program owns one tile of GROUPS x ROWS consecutive steps by BLOCK_D channels, loaded
# once as a [ROWS, GROUPS, BLOCK_D] tensor laid out so that each thread holds the ROWS steps of
# at most VEC channels: each group's run is scanned sequentially inside the thread, and only the
# GROUPS group totals are scanned across warps (far fewer instructions per element than scanning
# every step across lanes, and nothing is re-read).
#
# Tiles find their exact incoming state by decoupled look-back: each publishes its tile monoid
# (state 1) as soon as pass 1 is done, and its inclusive state (state 2) as soon as it knows its
# carry; a tile walks back over predecessors' monoids until it meets an inclusive state. The
# states are two bits per tile, 16 tiles to an int32 word, so one atomic reads a window of up to
# 16 predecessors. Decisions are taken on *scalar* words (one atomic per round trip, broadcast to
# all the program's threads), so every thread of a program follows the same path; data is
# written once, before its state bits (stores, barrier, release), and read after them (acquire,
# volatile loads).
# Tiles are handed out by an atomic ticket, so a program only waits on tiles whose programs
# already run: no deadlock whatever order the hardware schedules programs in.
# ----------------------------------------------------------------------------------------------


@triton.jit
def _widen_once(x):
    """``x`` as float32, bf16 by its bit pattern: an expression the compiler does not merge with
    the plain conversion of the same loaded values later on, which would keep this float32 copy
    live in registers until then (scan_diag_lookback_kernel's RESCAN)."""
    if x.dtype == tl.bfloat16:
        return (x.to(tl.int16, bitcast=True).to(tl.int32) << 16).to(tl.float32, bitcast=True)
    else:
        return x.to(tl.float32)


@triton.jit
def _publish(flags, tile, state: tl.constexpr):
    """Set ``tile``'s state bits (1: monoid published, 2: inclusive state published)."""
    bits = tl.full([], state, dtype=tl.int32) << (2 * (tile % 16))
    tl.atomic_or(flags + tile // 16, bits, sem="release")


@triton.jit
def _walk_back(
    agg_a_ptr, agg_b_ptr, incl_ptr, flags, slots, tile, BLOCK_D: tl.constexpr, WINDOW: tl.constexpr
):
    """The exact state entering ``tile``, ``[BLOCK_D]``.

    One scalar atomic reads the state word holding ``hi`` (the newest predecessor not yet
    composed) and so the states of the up to 16 tiles of that word at once; of those, the
    ``WINDOW`` newest up to ``hi`` are looked at. The tiles newer than the newest unpublished
    one have published at least their monoid; when the newest inclusive state is among them, it
    and the monoids after it give the carry; otherwise those monoids are composed and the walk
    moves back to the unpublished tile (spinning while it stays unpublished) or to the previous
    word. A walk over k unfinished tiles costs about k / WINDOW round trips instead of k."""
    w = tl.arange(0, 16)
    carry = tl.zeros([BLOCK_D], dtype=tl.float32)
    # run = the composed monoid of the tiles after hi, up to the tile (identity at first).
    run_a = tl.full([BLOCK_D], 1.0, dtype=tl.float32)
    run_b = tl.zeros([BLOCK_D], dtype=tl.float32)
    hi = tile - 1
    while hi >= 0:
        top = hi % 16
        word = tl.atomic_add(flags + hi // 16, 0, sem="acquire")
        # Decoded from one scalar: the same on every thread. 0 none, 1 monoid, 2 inclusive.
        flag = tl.minimum((word >> (2 * w)) & 3, 2)
        # Out of this round's reach: as if unpublished (the next round starts there).
        flag = tl.where(w <= top - WINDOW, 0, flag)
        looked = w <= top
        newest_incl = tl.max(tl.where(looked & (flag == 2), w, -1), axis=0)
        newest_gap = tl.max(tl.where(looked & (flag == 0), w, -1), axis=0)
        cut = tl.maximum(newest_incl, newest_gap)
        # Positions after `cut` (up to top) hold published monoids (flag 1): compose them,
        # newest first (masked-off rows load the identity, so no branch depends on them).
        base = hi - top
        for r in tl.static_range(WINDOW):
            pos = tl.full([BLOCK_D], r, dtype=tl.int32)
            pos = top - pos
            row = slots + (base + pos) * BLOCK_D
            on = pos > cut
            agg_a = tl.load(agg_a_ptr + row, mask=on, other=1.0, volatile=True)
            agg_b = tl.load(agg_b_ptr + row, mask=on, other=0.0, volatile=True)
            run_b = run_a * agg_b + run_b
            run_a = run_a * agg_a
        if newest_incl > newest_gap:
            state = tl.load(incl_ptr + slots + (base + newest_incl) * BLOCK_D, volatile=True)
            carry = run_a * state + run_b
            hi = -1
        else:
            # The unpublished tile, or (newest_gap = -1) the last tile of the word before.
            hi = hi - top + newest_gap
    return carry


@triton.jit
def _scratch(scratch_ptr, flag_ptr, BLOCK_D: tl.constexpr):
    """The look-back's scratch as ``(agg_a, agg_b, incl, flags, ticket)`` pointers: scratch_ptr
    holds three ``[n_tiles * B * n_cols_d, BLOCK_D]`` float32 slabs (published monoids and
    inclusive states, any contents; one program per tile, so the grid gives the slab size),
    flag_ptr the ticket counter and then the tile state words (int32 zeros)."""
    slab = tl.num_programs(0).to(tl.int64) * BLOCK_D
    return scratch_ptr, scratch_ptr + slab, scratch_ptr + 2 * slab, flag_ptr + 1, flag_ptr


@triton.jit
def _take_tile(ticket_ptr, n_tiles, n_cols_d):
    """This program's tile, handed out in ticket order: ``(tile, column, batch row, channel
    block)``, columns (batch row, channel block) fastest."""
    ticket = tl.atomic_add(ticket_ptr, 1)
    n_cols = tl.num_programs(0) // n_tiles
    tile = ticket // n_cols
    col = ticket % n_cols
    return tile, col, col // n_cols_d, col % n_cols_d


@triton.jit
def _clear_words(clear_ptr, clear_count):
    """Zero the first ``clear_count`` int32 words at clear_ptr (a multiple of 16), striped over
    the grid: the flag words that the launch before this one on the same stream left set, in the
    other of the stream's two flag buffers, which the launch after this one takes (launch.py).
    No program of this launch reads them, so plain stores do, with no fence."""
    for start in range(tl.program_id(0) * 16, clear_count, tl.num_programs(0) * 16):
        tl.store(clear_ptr + start + tl.arange(0, 16), tl.zeros([16], dtype=tl.int32))


@triton.jit
def _entering_state(
    agg_a_ptr, agg_b_ptr, incl_ptr, flags, slots, tile, tile_a, tile_b, h0,
    HAS_H0: tl.constexpr, GRAD_JAC: tl.constexpr, BLOCK_D: tl.constexpr, WINDOW: tl.constexpr,
):  # fmt: skip
    """Publish ``tile``'s monoid ``(tile_a, tile_b)`` (``[BLOCK_D]`` each) and return the exact
    state entering it: h0 (forward with h0) or zero for the first tile, the look-back's carry
    for the others."""
    carry = tl.zeros([BLOCK_D], dtype=tl.float32)
    if tile == 0:
        if HAS_H0 and not GRAD_JAC:
            carry = h0
    else:
        tl.store(agg_a_ptr + slots + tile * BLOCK_D, tile_a)
        tl.store(agg_b_ptr + slots + tile * BLOCK_D, tile_b)
        tl.debug_barrier()
        _publish(flags, tile, 1)
        carry = _walk_back(agg_a_ptr, agg_b_ptr, incl_ptr, flags, slots, tile, BLOCK_D, WINDOW)
    return carry


@triton.jit
def _publish_inclusive(incl_ptr, flags, slots, tile, state, BLOCK_D: tl.constexpr):
    tl.store(incl_ptr + slots + tile * BLOCK_D, state)
    tl.debug_barrier()
    _publish(flags, tile, 2)


@triton.jit
def scan_diag_lookback_kernel(
    jac_ptr,
    rhs_ptr,
    h0_ptr,
    out_ptr,
    prev_ptr,
    grad_jac_ptr,
    scratch_ptr,
    flag_ptr,
    clear_ptr,
    clear_count,
    T,
    D,
    n_cols_d,
    n_tiles,
    HAS_H0: tl.constexpr,
    REVERSE: tl.constexpr,
    SHIFT: tl.constexpr,
    GRAD_JAC: tl.constexpr,
    GROUPS: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
    INCLUSIVE_EVERY: tl.constexpr,
    WINDOW: tl.constexpr,
    VEC: tl.constexpr,
    RESCAN: tl.constexpr,
):
    """Grid (n_tiles * B * n_cols_d,): one program per tile, handed out in ticket order.

    Forward (GRAD_JAC=False): the first tile starts from h0 when HAS_H0, else zero.
    Adjoint (SHIFT=GRAD_JAC=True): the first tile starts from zero; h0 is the original
    recurrence's initial state, used for ∂L/∂jac at the boundary.
    scratch_ptr: ``[3, B * n_cols_d, n_tiles, BLOCK_D]`` float32 (any contents): the published
    tile monoids (two slabs) and inclusive states; flag_ptr: ``1 + B * n_cols_d * cdiv(n_tiles,
    16)`` int32 zeros, the ticket counter and then two state bits per tile (tile j of a column
    in word j // 16, bits 2 (j % 16) and up); clear_ptr, clear_count: int32 words to zero
    (:func:`_clear_words`), a multiple of 16.
    RESCAN: hold the tile's inputs in their storage dtype across the look-back and scan them a
    second time from the entering states (instead of holding the float32 scan): half the
    registers per element for 2-byte storage, so a thread can hold twice the steps.
    """
    _clear_words(clear_ptr, clear_count)
    agg_a_ptr, agg_b_ptr, incl_ptr, flag_ptr, ticket_ptr = _scratch(scratch_ptr, flag_ptr, BLOCK_D)
    tile, col, pid_b, pid_d = _take_tile(ticket_ptr, n_tiles, n_cols_d)
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    lanes = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    # The tile as a [ROWS, GROUPS, BLOCK_D] tensor: element (r, g, d) is processing position
    # p0 + g * ROWS + r of channel d. Channels are contiguous in memory, so Triton lays threads
    # (and vectors) along d first and warps along g, and every thread holds the ROWS rows of its
    # channels: the scan along axis 0 is sequential inside the thread.
    r3 = tl.arange(0, ROWS)[:, None, None]
    g3 = tl.arange(0, GROUPS)[None, :, None]
    # At most VEC channels per thread: the rest of the warp's lanes go along d as well.
    d3 = tl.max_contiguous(offs_d, VEC)[None, None, :]
    # Addresses as in scan_diag_tiles_kernel: one 64-bit scalar base per program (the tile's
    # first processing position) and 32-bit offsets inside the tile.
    p0 = tile * (GROUPS * ROWS)
    step = 1
    if REVERSE:
        step = -1
    base = (pid_b.to(tl.int64) * T + _time_index(p0, T, REVERSE)) * D
    rows = g3 * ROWS + r3
    rel = (rows * step) * D + d3
    p = p0 + rows
    valid = rows < T - p0
    mask = valid & (d3 < D)
    b_in = tl.load(rhs_ptr + base + rel, mask=mask, other=0.0)
    # SHIFT (the adjoint): the multiplier at position p is jac at position p - 1.
    a_in = tl.load(jac_ptr + (base - SHIFT * step * D) + rel, mask=mask & (p >= SHIFT), other=0.0)
    if RESCAN:
        a = _widen_once(a_in)
        b = _widen_once(b_in)
    else:
        a = a_in.to(tl.float32)
        b = b_in.to(tl.float32)
    a = tl.where(valid, a, 1.0)

    # Each group's run scanned inside the thread, then the group totals across warps.
    prod, acc = tl.associative_scan((a, b), 0, _combine_diag)
    last = r3 == ROWS - 1
    tot_a = tl.sum(tl.where(last, prod, 0.0), axis=0)
    tot_b = tl.sum(tl.where(last, acc, 0.0), axis=0)
    inc_a, inc_b = tl.associative_scan((tot_a, tot_b), 0, _combine_diag)
    tile_a = _last_row(inc_a, GROUPS)
    tile_b = _last_row(inc_b, GROUPS)

    # Look-back: the exact state entering this tile.
    flags = flag_ptr + col.to(tl.int64) * tl.cdiv(n_tiles, 16)
    slots = (col.to(tl.int64) * n_tiles) * BLOCK_D + lanes
    h0 = _initial_state(h0_ptr, pid_b, D, offs_d, mask_d, HAS_H0, BLOCK_D)
    carry = _entering_state(
        agg_a_ptr, agg_b_ptr, incl_ptr, flags, slots, tile, tile_a, tile_b, h0,
        HAS_H0, GRAD_JAC, BLOCK_D, WINDOW,
    )  # fmt: skip
    if INCLUSIVE_EVERY == 1:
        _publish_inclusive(incl_ptr, flags, slots, tile, tile_a * carry + tile_b, BLOCK_D)
    elif tile % INCLUSIVE_EVERY == 0:
        # Testing knob: the other tiles never publish an inclusive state, so their successors
        # must compose published monoids, even in the interpreter (which runs tiles in order).
        _publish_inclusive(incl_ptr, flags, slots, tile, tile_a * carry + tile_b, BLOCK_D)

    # The state entering each group: the state after the group before it (carry for group 0).
    groups = tl.arange(0, GROUPS)
    after = inc_a * carry[None, :] + inc_b
    before = tl.maximum(groups - 1, 0)[:, None] + tl.zeros([GROUPS, BLOCK_D], dtype=tl.int32)
    entering = tl.gather(after, before, 0)
    entering = tl.where((groups == 0)[:, None], carry[None, :], entering)
    if RESCAN:
        # Each group's first step takes its entering state; the padded rows past T (multiplier
        # 0 here) come after every valid row, so they change nothing that is stored.
        a = a_in.to(tl.float32)
        b = b_in.to(tl.float32) + tl.where(r3 == 0, a * entering[None, :, :], 0.0)
        _, y = tl.associative_scan((a, b), 0, _combine_diag)
    else:
        y = acc + prod * entering[None, :, :]
    tl.store(out_ptr + base + rel, y.to(out_ptr.dtype.element_ty), mask=mask)
    if GRAD_JAC:
        # The state the original recurrence consumed: its output one position later, h0 past
        # the end (as _consumed_row).
        prev = tl.load(prev_ptr + (base + step * D) + rel, mask=mask & (p + 1 < T), other=0.0)
        prev = prev.to(tl.float32)
        if HAS_H0:
            prev = tl.where(p + 1 == T, h0[None, None, :], prev)
        tl.store(grad_jac_ptr + base + rel, (y * prev).to(grad_jac_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _segment_total(
    jac_ptr, rhs_ptr, row_base, p_start, p_end, T, D, offs_d, mask_d,
    REVERSE: tl.constexpr, SHIFT: tl.constexpr, ROWS: tl.constexpr,
):  # fmt: skip
    """The monoid of positions ``[p_start, p_end)`` (``[BLOCK_D]`` each), read in chunks of
    ``ROWS`` steps, the next chunk's loads in flight while one is folded in."""
    run_a = tl.full(offs_d.shape, 1.0, dtype=tl.float32)
    run_b = tl.zeros(offs_d.shape, dtype=tl.float32)
    p = p_start + tl.arange(0, ROWS)
    a_next, b_next, _, _ = _load_diag_chunk(
        jac_ptr, rhs_ptr, row_base, p, p_end, T, D, offs_d, mask_d, REVERSE, SHIFT
    )
    # A runtime trip count (the tile's chunks inside the sequence): a constant one lets the
    # compiler unroll the loop and hoist every chunk's loads, which costs registers.
    for c in range(tl.cdiv(p_end - p_start, ROWS)):
        a, b = a_next, b_next
        p = p_start + (c + 1) * ROWS + tl.arange(0, ROWS)
        a_next, b_next, _, _ = _load_diag_chunk(
            jac_ptr, rhs_ptr, row_base, p, p_end, T, D, offs_d, mask_d, REVERSE, SHIFT
        )
        prod, acc = tl.associative_scan((a, b), 0, _combine_diag)
        chunk_a = _last_row(prod, ROWS)
        run_b = chunk_a * run_b + _last_row(acc, ROWS)
        run_a = chunk_a * run_a
    return run_a, run_b


@triton.jit
def scan_diag_twopass_kernel(
    jac_ptr,
    rhs_ptr,
    h0_ptr,
    out_ptr,
    prev_ptr,
    grad_jac_ptr,
    scratch_ptr,
    flag_ptr,
    clear_ptr,
    clear_count,
    T,
    D,
    n_cols_d,
    n_tiles,
    HAS_H0: tl.constexpr,
    REVERSE: tl.constexpr,
    SHIFT: tl.constexpr,
    GRAD_JAC: tl.constexpr,
    BLOCK_T: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
    INCLUSIVE_EVERY: tl.constexpr,
    WINDOW: tl.constexpr,
    VEC: tl.constexpr,
):
    """Grid (n_tiles * B * n_cols_d,): one program per tile of BLOCK_T steps, in ticket
    order, arguments as for scan_diag_lookback_kernel.

    The tile is read twice and held never: a first pass streams it in chunks of ROWS steps and
    folds them into the tile's monoid, which is published; the look-back gives the entering
    state; a second pass streams the tile again (as scan_diag_kernel walks a sequence) and
    writes the states. Registers hold two chunks whatever the tile's length, so tiles can be
    long and the look-back chain short: for few channels, where the one-pass tiles wait on
    their chain.
    """
    _clear_words(clear_ptr, clear_count)
    agg_a_ptr, agg_b_ptr, incl_ptr, flag_ptr, ticket_ptr = _scratch(scratch_ptr, flag_ptr, BLOCK_D)
    tile, col, pid_b, pid_d = _take_tile(ticket_ptr, n_tiles, n_cols_d)
    offs_d = tl.max_contiguous(pid_d * BLOCK_D + tl.arange(0, BLOCK_D), VEC)
    lanes = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    row_base = pid_b.to(tl.int64) * T * D
    p_start = tile * BLOCK_T
    p_end = tl.minimum(p_start + BLOCK_T, T)

    tile_a, tile_b = _segment_total(
        jac_ptr, rhs_ptr, row_base, p_start, p_end, T, D, offs_d, mask_d, REVERSE, SHIFT, ROWS
    )

    flags = flag_ptr + col.to(tl.int64) * tl.cdiv(n_tiles, 16)
    slots = (col.to(tl.int64) * n_tiles) * BLOCK_D + lanes
    h0 = _initial_state(h0_ptr, pid_b, D, offs_d, mask_d, HAS_H0, BLOCK_D)
    carry = _entering_state(
        agg_a_ptr, agg_b_ptr, incl_ptr, flags, slots, tile, tile_a, tile_b, h0,
        HAS_H0, GRAD_JAC, BLOCK_D, WINDOW,
    )  # fmt: skip
    if (INCLUSIVE_EVERY == 1) or (tile % INCLUSIVE_EVERY == 0):
        # INCLUSIVE_EVERY > 1 is the testing knob of scan_diag_lookback_kernel.
        _publish_inclusive(incl_ptr, flags, slots, tile, tile_a * carry + tile_b, BLOCK_D)

    # Second pass: the tile's states from the exact entering state. Only the prefetched values
    # cross iterations; each chunk's addresses are computed again where they are stored (held
    # across the loop they cost two registers per element).
    p = p_start + tl.arange(0, ROWS)
    a_next, b_next, _, _ = _load_diag_chunk(
        jac_ptr, rhs_ptr, row_base, p, p_end, T, D, offs_d, mask_d, REVERSE, SHIFT
    )
    for c in range(tl.cdiv(p_end - p_start, ROWS)):
        a, b = a_next, b_next
        p = p_start + c * ROWS + tl.arange(0, ROWS)
        a_next, b_next, _, _ = _load_diag_chunk(
            jac_ptr, rhs_ptr, row_base, p + ROWS, p_end, T, D, offs_d, mask_d, REVERSE, SHIFT
        )
        mask = (p < p_end)[:, None] & mask_d[None, :]
        offs = row_base + _time_index(p, T, REVERSE)[:, None].to(tl.int64) * D + offs_d[None, :]
        if GRAD_JAC:
            prev = _consumed_state(prev_ptr, row_base, p, mask, T, D, offs_d, h0, REVERSE, HAS_H0)
        prod, acc = tl.associative_scan((a, b), 0, _combine_diag)
        y = acc + prod * carry[None, :]
        tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)
        if GRAD_JAC:
            tl.store(grad_jac_ptr + offs, (y * prev).to(grad_jac_ptr.dtype.element_ty), mask=mask)
        carry = _last_row(y, ROWS)


# ----------------------------------------------------------------------------------------------
# Diagonal scan in one pass with decoupled look-back, each tile scanned across lanes.
#
# Same tiles, publication protocol and ticket order as scan_diag_lookback_kernel, but the tile
# is loaded once and scanned by tl.associative_scan along time (Triton walks the rows each thread
# holds sequentially, then combines across lanes and warps), so nothing is re-read. The tile's
# monoid and inclusive state are the scan's last row: the threads holding that row store it
# (a masked 2-D store) instead of reducing the tile to a vector, and successors read it back.
# ----------------------------------------------------------------------------------------------


@triton.jit
def _store_last_row(ptr, slots2, x, rows, BLOCK_T: tl.constexpr):
    # The pointer must have the tile's shape (tl.store broadcasts mask and value to the
    # pointer, not the other way): slots2 repeats the row's slots on every row.
    tl.store(ptr + slots2, x, mask=(rows == BLOCK_T - 1)[:, None])


@triton.jit
def scan_diag_tiles_kernel(
    jac_ptr,
    rhs_ptr,
    h0_ptr,
    out_ptr,
    prev_ptr,
    grad_jac_ptr,
    scratch_ptr,
    flag_ptr,
    T,
    D,
    n_cols_d,
    n_tiles,
    HAS_H0: tl.constexpr,
    REVERSE: tl.constexpr,
    SHIFT: tl.constexpr,
    GRAD_JAC: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
    INCLUSIVE_EVERY: tl.constexpr,
    WINDOW: tl.constexpr,
):
    """Grid (n_tiles * B * n_cols_d,): one program per tile of BLOCK_T steps, in ticket order.

    Arguments as for scan_diag_lookback_kernel, but for clear_ptr and clear_count: the tiles
    plan takes a freshly zeroed flag buffer at every launch (a clear at the start of its
    programs cost it 1.5-5.6 points of copy bandwidth on an H100, more than the zero fill).
    """
    agg_a_ptr, agg_b_ptr, incl_ptr, flag_ptr, ticket_ptr = _scratch(scratch_ptr, flag_ptr, BLOCK_D)
    tile, col, pid_b, pid_d = _take_tile(ticket_ptr, n_tiles, n_cols_d)
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    lanes = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    rows = tl.arange(0, BLOCK_T)
    # Addresses: one 64-bit scalar base per program (the tile's first processing position) and
    # 32-bit offsets inside the tile, so the per-element address arithmetic stays narrow.
    p0 = tile * BLOCK_T
    step = 1
    if REVERSE:
        step = -1
    t_first = _time_index(p0, T, REVERSE)
    base = (pid_b.to(tl.int64) * T + t_first) * D
    rel = (rows * step)[:, None] * D + offs_d[None, :]
    a, b, mask = _load_tile_row(
        jac_ptr, rhs_ptr, base, rel, p0 + rows, rows < T - p0, mask_d, step * D, SHIFT
    )
    h0 = _initial_state(h0_ptr, pid_b, D, offs_d, mask_d, HAS_H0, BLOCK_D)
    if GRAD_JAC:
        prev = _consumed_row(prev_ptr, base, rel, p0 + rows, mask, T, step * D, h0, HAS_H0)
    prod, acc = tl.associative_scan((a, b), 0, _combine_diag)

    flags = flag_ptr + col.to(tl.int64) * tl.cdiv(n_tiles, 16)
    slots = (col.to(tl.int64) * n_tiles) * BLOCK_D + lanes
    slots2 = slots[None, :] + tile * BLOCK_D + tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.int64)
    carry = tl.zeros([BLOCK_D], dtype=tl.float32)
    if tile == 0:
        if HAS_H0 and not GRAD_JAC:
            carry = h0
    else:
        _store_last_row(agg_a_ptr, slots2, prod, rows, BLOCK_T)
        _store_last_row(agg_b_ptr, slots2, acc, rows, BLOCK_T)
        tl.debug_barrier()
        _publish(flags, tile, 1)
        carry = _walk_back(agg_a_ptr, agg_b_ptr, incl_ptr, flags, slots, tile, BLOCK_D, WINDOW)
    y = acc + prod * carry[None, :]
    if (INCLUSIVE_EVERY == 1) or (tile % INCLUSIVE_EVERY == 0):
        # INCLUSIVE_EVERY > 1 is the testing knob of scan_diag_lookback_kernel.
        _store_last_row(incl_ptr, slots2, y, rows, BLOCK_T)
        tl.debug_barrier()
        _publish(flags, tile, 2)
    tl.store(out_ptr + base + rel, y.to(out_ptr.dtype.element_ty), mask=mask)
    if GRAD_JAC:
        tl.store(grad_jac_ptr + base + rel, (y * prev).to(grad_jac_ptr.dtype.element_ty), mask=mask)


# ----------------------------------------------------------------------------------------------
# Block-diagonal scan: K <= 4, padded to 4x4 (padded coordinates stay exactly zero).
# ----------------------------------------------------------------------------------------------


@triton.jit
def _matvec4(
    m00, m01, m02, m03, m10, m11, m12, m13, m20, m21, m22, m23, m30, m31, m32, m33, v0, v1, v2, v3
):
    return (
        m00 * v0 + m01 * v1 + m02 * v2 + m03 * v3,
        m10 * v0 + m11 * v1 + m12 * v2 + m13 * v3,
        m20 * v0 + m21 * v1 + m22 * v2 + m23 * v3,
        m30 * v0 + m31 * v1 + m32 * v2 + m33 * v3,
    )


@triton.jit
def _combine_block4(
    a00, a01, a02, a03, a10, a11, a12, a13, a20, a21, a22, a23, a30, a31, a32, a33,
    b0, b1, b2, b3,
    c00, c01, c02, c03, c10, c11, c12, c13, c20, c21, c22, c23, c30, c31, c32, c33,
    d0, d1, d2, d3,
):  # fmt: skip
    # (C, d)∘(A, b) = (C A, C b + d); (A, b) is the earlier element. Column j of C A is C a_j.
    # fmt: off
    r00, r10, r20, r30 = _matvec4(c00, c01, c02, c03, c10, c11, c12, c13, c20, c21, c22, c23, c30, c31, c32, c33, a00, a10, a20, a30)
    r01, r11, r21, r31 = _matvec4(c00, c01, c02, c03, c10, c11, c12, c13, c20, c21, c22, c23, c30, c31, c32, c33, a01, a11, a21, a31)
    r02, r12, r22, r32 = _matvec4(c00, c01, c02, c03, c10, c11, c12, c13, c20, c21, c22, c23, c30, c31, c32, c33, a02, a12, a22, a32)
    r03, r13, r23, r33 = _matvec4(c00, c01, c02, c03, c10, c11, c12, c13, c20, c21, c22, c23, c30, c31, c32, c33, a03, a13, a23, a33)
    s0, s1, s2, s3 = _matvec4(c00, c01, c02, c03, c10, c11, c12, c13, c20, c21, c22, c23, c30, c31, c32, c33, b0, b1, b2, b3)
    return (
        r00, r01, r02, r03, r10, r11, r12, r13, r20, r21, r22, r23, r30, r31, r32, r33,
        s0 + d0, s1 + d1, s2 + d2, s3 + d3,
    )
    # fmt: on


@triton.jit
def _combine_block2(a00, a01, a10, a11, b0, b1, c00, c01, c10, c11, d0, d1):
    # The 2x2 case of _combine_block4 (LSTM-sized blocks): a quarter of the arithmetic.
    return (
        c00 * a00 + c01 * a10,
        c00 * a01 + c01 * a11,
        c10 * a00 + c11 * a10,
        c10 * a01 + c11 * a11,
        c00 * b0 + c01 * b1 + d0,
        c10 * b0 + c11 * b1 + d1,
    )


@triton.jit
def _load_jac_entry(
    jac_ptr, elem, mask, valid, I: tl.constexpr, J: tl.constexpr, K: tl.constexpr,
    TRANSPOSE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    if I < K and J < K:
        if TRANSPOSE:
            idx = J * K + I
        else:
            idx = I * K + J
        v = tl.load(jac_ptr + elem * (K * K) + idx, mask=mask, other=0.0).to(tl.float32)
        if I == J:
            v = tl.where(valid[:, None], v, 1.0)
    else:
        v = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
    return v


@triton.jit
def _load_jac_row(
    jac_ptr, elem, mask, valid, I: tl.constexpr, K: tl.constexpr,
    TRANSPOSE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    return (
        _load_jac_entry(jac_ptr, elem, mask, valid, I, 0, K, TRANSPOSE, BLOCK_T, BLOCK_D),
        _load_jac_entry(jac_ptr, elem, mask, valid, I, 1, K, TRANSPOSE, BLOCK_T, BLOCK_D),
        _load_jac_entry(jac_ptr, elem, mask, valid, I, 2, K, TRANSPOSE, BLOCK_T, BLOCK_D),
        _load_jac_entry(jac_ptr, elem, mask, valid, I, 3, K, TRANSPOSE, BLOCK_T, BLOCK_D),
    )


@triton.jit
def _load_vec_entry(
    ptr, elem, mask, I: tl.constexpr, K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr
):
    if I < K:
        v = tl.load(ptr + elem * K + I, mask=mask, other=0.0).to(tl.float32)
    else:
        v = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
    return v


@triton.jit
def _load_state_entry(ptr, base, mask_d, I: tl.constexpr, K: tl.constexpr, BLOCK_D: tl.constexpr):
    if I < K:
        v = tl.load(ptr + base * K + I, mask=mask_d, other=0.0).to(tl.float32)
    else:
        v = tl.zeros([BLOCK_D], dtype=tl.float32)
    return v


@triton.jit
def _store_vec_entry(ptr, elem, value, mask, I: tl.constexpr, K: tl.constexpr):
    if I < K:
        tl.store(ptr + elem * K + I, value.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _store_outer_row(ptr, elem, mu_i, v0, v1, v2, v3, mask, I: tl.constexpr, K: tl.constexpr):
    # ∂L/∂A[i, j] = μ_i * prev_j for j < K.
    if I < K:
        row = ptr + elem * (K * K) + I * K
        tl.store(row + 0, (mu_i * v0).to(ptr.dtype.element_ty), mask=mask)
        if K > 1:
            tl.store(row + 1, (mu_i * v1).to(ptr.dtype.element_ty), mask=mask)
        if K > 2:
            tl.store(row + 2, (mu_i * v2).to(ptr.dtype.element_ty), mask=mask)
        if K > 3:
            tl.store(row + 3, (mu_i * v3).to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def scan_block_diag_kernel(
    jac_ptr,
    rhs_ptr,
    h0_ptr,
    out_ptr,
    prev_ptr,
    grad_jac_ptr,
    T,
    D,
    K: tl.constexpr,
    HAS_H0: tl.constexpr,
    REVERSE: tl.constexpr,
    SHIFT: tl.constexpr,
    TRANSPOSE: tl.constexpr,
    GRAD_JAC: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Grid (cdiv(D, BLOCK_D), B): one program walks the whole sequence of one channel block.

    Forward (``GRAD_JAC=False``): h0 ``[B, D, K]`` is the initial state when HAS_H0.
    Adjoint (``SHIFT=TRANSPOSE=GRAD_JAC=True``): the initial carry is zero and h0 (when HAS_H0)
    is the original recurrence's initial state, used for ``∂L/∂A`` at the boundary.
    """
    pid_d = tl.program_id(0)
    pid_b = tl.program_id(1)
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    state_base = pid_b.to(tl.int64) * D + offs_d
    row_base = pid_b.to(tl.int64) * T * D

    y0 = tl.zeros([BLOCK_D], dtype=tl.float32)
    y1 = tl.zeros([BLOCK_D], dtype=tl.float32)
    y2 = tl.zeros([BLOCK_D], dtype=tl.float32)
    y3 = tl.zeros([BLOCK_D], dtype=tl.float32)
    h0_0 = tl.zeros([BLOCK_D], dtype=tl.float32)
    h0_1 = tl.zeros([BLOCK_D], dtype=tl.float32)
    h0_2 = tl.zeros([BLOCK_D], dtype=tl.float32)
    h0_3 = tl.zeros([BLOCK_D], dtype=tl.float32)
    if HAS_H0:
        h0_0 = _load_state_entry(h0_ptr, state_base, mask_d, 0, K, BLOCK_D)
        h0_1 = _load_state_entry(h0_ptr, state_base, mask_d, 1, K, BLOCK_D)
        h0_2 = _load_state_entry(h0_ptr, state_base, mask_d, 2, K, BLOCK_D)
        h0_3 = _load_state_entry(h0_ptr, state_base, mask_d, 3, K, BLOCK_D)
        if not GRAD_JAC:
            y0, y1, y2, y3 = h0_0, h0_1, h0_2, h0_3

    for c0 in range(0, T, BLOCK_T):
        p = c0 + tl.arange(0, BLOCK_T)
        valid = p < T
        t = _time_index(p, T, REVERSE)
        t_jac = _time_index(p - SHIFT, T, REVERSE)
        mask = valid[:, None] & mask_d[None, :]
        elem = row_base + t[:, None].to(tl.int64) * D + offs_d[None, :]
        elem_jac = row_base + t_jac[:, None].to(tl.int64) * D + offs_d[None, :]
        mask_jac = mask & (p >= SHIFT)[:, None]
        a00, a01, a02, a03 = _load_jac_row(
            jac_ptr, elem_jac, mask_jac, valid, 0, K, TRANSPOSE, BLOCK_T, BLOCK_D
        )
        a10, a11, a12, a13 = _load_jac_row(
            jac_ptr, elem_jac, mask_jac, valid, 1, K, TRANSPOSE, BLOCK_T, BLOCK_D
        )
        a20, a21, a22, a23 = _load_jac_row(
            jac_ptr, elem_jac, mask_jac, valid, 2, K, TRANSPOSE, BLOCK_T, BLOCK_D
        )
        a30, a31, a32, a33 = _load_jac_row(
            jac_ptr, elem_jac, mask_jac, valid, 3, K, TRANSPOSE, BLOCK_T, BLOCK_D
        )
        b0 = _load_vec_entry(rhs_ptr, elem, mask, 0, K, BLOCK_T, BLOCK_D)
        b1 = _load_vec_entry(rhs_ptr, elem, mask, 1, K, BLOCK_T, BLOCK_D)
        b2 = _load_vec_entry(rhs_ptr, elem, mask, 2, K, BLOCK_T, BLOCK_D)
        b3 = _load_vec_entry(rhs_ptr, elem, mask, 3, K, BLOCK_T, BLOCK_D)

        if K <= 2:
            p00, p01, p10, p11, s0, s1 = tl.associative_scan(
                (a00, a01, a10, a11, b0, b1), 0, _combine_block2
            )
            # Entries 2 and 3 stay the exact zeros they were loaded as.
            p02, p03, p12, p13 = a02, a03, a12, a13
            p20, p21, p22, p23, p30, p31, p32, p33 = a20, a21, a22, a23, a30, a31, a32, a33
            s2, s3 = b2, b3
        else:
            (
                p00, p01, p02, p03, p10, p11, p12, p13, p20, p21, p22, p23, p30, p31, p32, p33,
                s0, s1, s2, s3,
            ) = tl.associative_scan(
                (
                    a00, a01, a02, a03, a10, a11, a12, a13, a20, a21, a22, a23, a30, a31, a32, a33,
                    b0, b1, b2, b3,
                ),
                0,
                _combine_block4,
            )  # fmt: skip
        c0_, c1_, c2_, c3_ = _matvec4(
            p00, p01, p02, p03, p10, p11, p12, p13, p20, p21, p22, p23, p30, p31, p32, p33,
            y0[None, :], y1[None, :], y2[None, :], y3[None, :],
        )  # fmt: skip
        o0 = s0 + c0_
        o1 = s1 + c1_
        o2 = s2 + c2_
        o3 = s3 + c3_
        _store_vec_entry(out_ptr, elem, o0, mask, 0, K)
        _store_vec_entry(out_ptr, elem, o1, mask, 1, K)
        _store_vec_entry(out_ptr, elem, o2, mask, 2, K)
        _store_vec_entry(out_ptr, elem, o3, mask, 3, K)
        if GRAD_JAC:
            p_next = p + 1
            t_next = _time_index(p_next, T, REVERSE)
            elem_next = row_base + t_next[:, None].to(tl.int64) * D + offs_d[None, :]
            mask_next = mask & (p_next < T)[:, None]
            v0 = _load_vec_entry(prev_ptr, elem_next, mask_next, 0, K, BLOCK_T, BLOCK_D)
            v1 = _load_vec_entry(prev_ptr, elem_next, mask_next, 1, K, BLOCK_T, BLOCK_D)
            v2 = _load_vec_entry(prev_ptr, elem_next, mask_next, 2, K, BLOCK_T, BLOCK_D)
            v3 = _load_vec_entry(prev_ptr, elem_next, mask_next, 3, K, BLOCK_T, BLOCK_D)
            if HAS_H0:
                at_end = (p_next == T)[:, None]
                v0 = tl.where(at_end, h0_0[None, :], v0)
                v1 = tl.where(at_end, h0_1[None, :], v1)
                v2 = tl.where(at_end, h0_2[None, :], v2)
                v3 = tl.where(at_end, h0_3[None, :], v3)
            _store_outer_row(grad_jac_ptr, elem, o0, v0, v1, v2, v3, mask, 0, K)
            _store_outer_row(grad_jac_ptr, elem, o1, v0, v1, v2, v3, mask, 1, K)
            _store_outer_row(grad_jac_ptr, elem, o2, v0, v1, v2, v3, mask, 2, K)
            _store_outer_row(grad_jac_ptr, elem, o3, v0, v1, v2, v3, mask, 3, K)
        y0 = _last_row(o0, BLOCK_T)
        y1 = _last_row(o1, BLOCK_T)
        y2 = _last_row(o2, BLOCK_T)
        y3 = _last_row(o3, BLOCK_T)
