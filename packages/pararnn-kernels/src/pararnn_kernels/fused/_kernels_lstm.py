"""Triton kernels of the fused ParaLSTM layer (kernel-only module: no types, no public API).

The cell (``pararnn_core.ParaLSTM``; ``u = [u_f, u_z, u_o]`` along the last axis, parameter rows
``w = [a_f, a_z, a_o, p_f, p_o]`` of shape ``[5, D]``: the recurrent weight's three rows, then the
peephole weight's two)::

    f = σ(u_f + a_f h + p_f c),  z = tanh(u_z + a_z h),  c' = z + f (c - z),
    o = σ(u_o + a_o h + p_o c'), h' = o tanh(c')

State per channel ``(c, h)``; the Jacobian is a 2x2 block per channel, rows ``(c', h')``, columns
``(c, h)``. Layouts: ``u [B, T, 3D]``, states ``[B, T, D, 2]`` (``c`` at ``[..., 0]``), ``h0``
``[B, D, 2]``, all contiguous; arithmetic in float32 whatever the storage dtype.

The kernels mirror the GRU's (``_kernels``; the same grids, arguments and history layout), with
the pair ``(A, b)`` of a 2x2 block and a 2-vector in place of the scalar pair:

* ``lstm_newton_kernel`` -- chunked exact-carry Newton; each update scans the six tiles
  ``(A00, A01, A10, A11, b0, b1)`` under ``(A2, b2)∘(A1, b1) = (A2 A1, A2 b1 + b2)``; time
  segments chained on the device as the GRU's.
* ``lstm_backward_kernel`` -- one reverse pass. The scan runs on ``ν_t = J_tᵀ μ_t`` (the
  cotangent of the state step t consumed): ``ν_t = J_tᵀ ν_{t+1} + J_tᵀ g_t``, whose multiplier
  is each row's own Jacobian, so only the 2-vector ``ν`` is shifted by one row (not the block);
  then ``μ_t = g_t + ν_{t+1}`` and ``∂L/∂h0 = ν_0``.
* ``lstm_sequential_kernel`` -- the recurrence step by step, ``ROWS`` steps per loaded tile.
"""

import triton
import triton.language as tl

from ..scan._kernels import _combine_block2
from ._kernels import (
    _combine,
    _first_row_carry,
    _partial_slots,
    _pick_row,
    _publish_segment,
    _publish_stats,
    _record_residual,
    _residual_size,
    _segment_program,
    _shift_rows,
    _sigmoid,
    _start_mismatch,
    _tanh,
    _tile_max,
    _wait_for_segment_before,
)


@triton.jit
def _lstm_forward(c, h, u_f, u_z, u_o, a_f, a_z, a_o, p_f, p_o):
    f = _sigmoid(u_f + a_f * h + p_f * c)
    z = _tanh(u_z + a_z * h)
    c_new = z + f * (c - z)
    o = _sigmoid(u_o + a_o * h + p_o * c_new)
    tc = _tanh(c_new)
    return f, z, c_new, o, tc


@triton.jit
def _lstm_jacobian(c, h, f, z, o, tc, a_f, a_z, a_o, p_f, p_o):
    """The 2x2 block ``∂(c', h')/∂(c, h)`` and the two factors the backward reuses."""
    s_f = f * (1.0 - f) * (c - z)
    dc_dc = f + s_f * p_f
    dc_dh = s_f * a_f + (1.0 - f) * (1.0 - z * z) * a_z
    s_o = o * (1.0 - o) * tc
    # ∂h'/∂c' through both the peephole of o and tanh(c').
    d_out = s_o * p_o + o * (1.0 - tc * tc)
    return dc_dc, dc_dh, d_out * dc_dc, s_o * a_o + d_out * dc_dh, s_o, d_out


@triton.jit
def _load_gates(u_ptr, offs_u, mask, D):
    u_f = tl.load(u_ptr + offs_u, mask=mask, other=0.0).to(tl.float32)
    u_z = tl.load(u_ptr + offs_u + D, mask=mask, other=0.0).to(tl.float32)
    u_o = tl.load(u_ptr + offs_u + 2 * D, mask=mask, other=0.0).to(tl.float32)
    return u_f, u_z, u_o


@triton.jit
def _load_weights(w_ptr, offs_d, mask_d, D):
    a_f = tl.load(w_ptr + offs_d, mask=mask_d, other=0.0).to(tl.float32)
    a_z = tl.load(w_ptr + D + offs_d, mask=mask_d, other=0.0).to(tl.float32)
    a_o = tl.load(w_ptr + 2 * D + offs_d, mask=mask_d, other=0.0).to(tl.float32)
    p_f = tl.load(w_ptr + 3 * D + offs_d, mask=mask_d, other=0.0).to(tl.float32)
    p_o = tl.load(w_ptr + 4 * D + offs_d, mask=mask_d, other=0.0).to(tl.float32)
    return a_f, a_z, a_o, p_f, p_o


@triton.jit
def _load_chunk(u_ptr, row_base, c0, t_end, D, offs_d, mask_d, BLOCK_T: tl.constexpr):
    t = c0 + tl.arange(0, BLOCK_T)
    mask = (t < t_end)[:, None] & mask_d[None, :]
    offs_u = (row_base + t)[:, None] * (3 * D) + offs_d[None, :]
    return _load_gates(u_ptr, offs_u, mask, D)


@triton.jit
def _lstm_guess(u_f, u_z, u_o, a_f, a_z, a_o, p_f, p_o, GUESS: tl.constexpr):
    """The one-row initial guess ``(c, h)``: one step from the empty state (``GUESS`` 1 or 2)
    or the empty state, zeros (``GUESS=0``)."""
    empty = tl.zeros_like(u_f)
    if GUESS >= 1:
        _f, _z, c, o, tc = _lstm_forward(empty, empty, u_f, u_z, u_o, a_f, a_z, a_o, p_f, p_o)
        return c, o * tc
    else:
        return empty, empty


@triton.jit
def _lstm_uncoupled(u_f, u_z, u_o, p_o, c, rows):
    """A chunk's states ``(c, h)`` with the couplings to ``h`` and the forget gate's peephole
    dropped (``GUESS=2``), solved from the exact ``c`` before it: ``c_t = f c_{t-1} + (1 - f) z``
    with ``f = σ(u_f)``, ``z = tanh(u_z)`` (one scan), then ``h_t = σ(u_o + p_o c_t) tanh(c_t)``."""
    f = _sigmoid(u_f)
    _prod, s_c = tl.associative_scan(
        (f, _first_row_carry(f, (1.0 - f) * _tanh(u_z), rows, c)), 0, _combine
    )
    return s_c, _sigmoid(u_o + p_o[None, :] * s_c) * _tanh(s_c)


@triton.jit
def _lstm_chunk(
    s_c, s_h, c, h, u_f, u_z, u_o, a_f, a_z, a_o, p_f, p_o, mask, valid, rows, before, hist,
    slots, tol, omega, MAX_ITERS: tl.constexpr, HIST: tl.constexpr,
):  # fmt: skip
    """Newton on one chunk from the guess ``(s_c, s_h)`` and the exact state ``(c, h)`` before
    it: ``(s_c, s_h, hist, updates)`` (as ``_kernels._gru_chunk``)."""
    k = 0
    done = 0
    while done == 0:
        prev_c = _shift_rows(s_c, before, rows, c)
        prev_h = _shift_rows(s_h, before, rows, h)
        f, z, c_new, o, tc = _lstm_forward(prev_c, prev_h, u_f, u_z, u_o, a_f, a_z, a_o, p_f, p_o)
        j00, j01, j10, j11, _s_o, _d_out = _lstm_jacobian(
            prev_c, prev_h, f, z, o, tc, a_f, a_z, a_o, p_f, p_o
        )
        r_c = tl.where(mask, c_new - s_c, 0.0)
        r_h = tl.where(mask, o * tc - s_h, 0.0)
        # One reduction over the tile for both components (each crosses the warps once).
        worst = _tile_max(tl.maximum(_residual_size(r_c), _residual_size(r_h)))
        hist, done = _record_residual(hist, slots, k, worst, tol, MAX_ITERS, HIST)
        if done == 0:
            # Rows past the end multiply by the identity, so the scan stays exact.
            _p00, _p01, _p10, _p11, d_c, d_h = tl.associative_scan(
                (
                    tl.where(valid[:, None], j00, 1.0),
                    tl.where(valid[:, None], j01, 0.0),
                    tl.where(valid[:, None], j10, 0.0),
                    tl.where(valid[:, None], j11, 1.0),
                    r_c,
                    r_h,
                ),
                0,
                _combine_block2,
            )
            s_c = s_c + omega * d_c
            s_h = s_h + omega * d_h
            k += 1
    return s_c, s_h, hist, k


@triton.jit
def _store_chunk(out_ptr, offs_out, mask, s_c, s_h, rows, last):
    """Store a chunk's solved states; its end state ``(c, h)`` (row ``last``)."""
    tl.store(out_ptr + offs_out, s_c.to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(out_ptr + offs_out + 1, s_h.to(out_ptr.dtype.element_ty), mask=mask)
    return _pick_row(s_c, rows, last), _pick_row(s_h, rows, last)


@triton.jit
def lstm_newton_kernel(
    u_ptr,
    w_ptr,
    start_ptr,
    out_ptr,
    end_ptr,
    chunk_ptr,
    sync_ptr,
    stats_ptr,
    T,
    D,
    seg_len,
    tol,
    omega,
    MAX_ITERS: tl.constexpr,
    GUESS: tl.constexpr,
    CHAINED: tl.constexpr,
    HIST: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """``h0 [B, D, 2]`` (``start``) -> states ``out [B, T, D, 2]``; ``end [S, B, D, 2]``,
    ``chunk [B, n_chunks, D, 2]``, ``sync``, ``GUESS`` and ``stats`` as in
    ``gru_newton_kernel`` (``GUESS=0``: the empty state, zeros; ``GUESS=2``:
    ``_lstm_uncoupled``)."""
    pid_d, pid_b, seg = _segment_program(sync_ptr, CHAINED)
    n_b = tl.num_programs(1)
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    rows = tl.arange(0, BLOCK_T)
    a_f, a_z, a_o, p_f, p_o = _load_weights(w_ptr, offs_d, mask_d, D)

    seg_slot = (seg.to(tl.int64) * n_b + pid_b) * D + offs_d
    start = (pid_b.to(tl.int64) * D + offs_d) * 2
    c = tl.load(start_ptr + start, mask=mask_d, other=0.0).to(tl.float32)
    h = tl.load(start_ptr + start + 1, mask=mask_d, other=0.0).to(tl.float32)
    hist = tl.full([HIST], -1.0, dtype=tl.float32)
    slots = tl.arange(0, HIST)
    most_iters = tl.full([], 0, dtype=tl.int32)
    before = tl.maximum(rows - 1, 0)[:, None] + tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.int32)

    t_begin = seg * seg_len
    t_end = tl.minimum(t_begin + seg_len, T)
    row_base = pid_b.to(tl.int64) * T
    chunk_base = pid_b.to(tl.int64) * tl.cdiv(T, BLOCK_T)
    if CHAINED:
        # A later segment starts from the initial guess one step before it.
        before_row = (row_base + tl.maximum(t_begin - 1, 0)) * (3 * D) + offs_d
        g_f, g_z, g_o = _load_gates(u_ptr, before_row, mask_d, D)
        g_c, g_h = _lstm_guess(g_f, g_z, g_o, a_f, a_z, a_o, p_f, p_o, GUESS)
        c = tl.where(seg > 0, g_c, c)
        h = tl.where(seg > 0, g_h, h)
    n_f, n_z, n_o = _load_chunk(u_ptr, row_base, t_begin, t_end, D, offs_d, mask_d, BLOCK_T)
    for c0 in range(t_begin, t_end, BLOCK_T):
        u_f, u_z, u_o = n_f, n_z, n_o
        n_f, n_z, n_o = _load_chunk(
            u_ptr, row_base, c0 + BLOCK_T, t_end, D, offs_d, mask_d, BLOCK_T
        )
        t = c0 + rows
        valid = t < t_end
        mask = valid[:, None] & mask_d[None, :]
        offs_out = ((row_base + t)[:, None] * D + offs_d[None, :]) * 2
        if GUESS == 2:
            s_c, s_h = _lstm_uncoupled(u_f, u_z, u_o, p_o, c, rows)
        else:
            s_c, s_h = _lstm_guess(u_f, u_z, u_o, a_f, a_z, a_o, p_f, p_o, GUESS)
        if CHAINED:
            slot = ((chunk_base + c0 // BLOCK_T) * D + offs_d) * 2
            tl.store(chunk_ptr + slot, c, mask=mask_d)
            tl.store(chunk_ptr + slot + 1, h, mask=mask_d)
        s_c, s_h, hist, k = _lstm_chunk(
            s_c, s_h, c, h, u_f, u_z, u_o, a_f, a_z, a_o, p_f, p_o, mask, valid, rows, before,
            hist, slots, tol, omega, MAX_ITERS, HIST,
        )  # fmt: skip
        most_iters = tl.maximum(most_iters, k)
        last = tl.minimum(c0 + BLOCK_T, t_end) - 1 - c0
        c, h = _store_chunk(out_ptr, offs_out, mask, s_c, s_h, rows, last)

    if CHAINED:
        if seg > 0:
            # The segment's correcting walk (as in gru_newton_kernel).
            tl.debug_barrier()
            _wait_for_segment_before(sync_ptr, pid_d, pid_b, seg)
            prev_slot = (seg_slot - n_b * D) * 2
            c_in = tl.load(end_ptr + prev_slot, mask=mask_d, other=0.0, volatile=True)
            h_in = tl.load(end_ptr + prev_slot + 1, mask=mask_d, other=0.0, volatile=True)
            c0 = t_begin
            slot = ((chunk_base + c0 // BLOCK_T) * D + offs_d) * 2
            live = c0 < t_end
            gap = tl.maximum(
                _start_mismatch(chunk_ptr + slot, c_in, mask_d, live),
                _start_mismatch(chunk_ptr + slot + 1, h_in, mask_d, live),
            )
            while gap > tol:
                u_f, u_z, u_o = _load_chunk(u_ptr, row_base, c0, t_end, D, offs_d, mask_d, BLOCK_T)
                t = c0 + rows
                valid = t < t_end
                mask = valid[:, None] & mask_d[None, :]
                offs_out = ((row_base + t)[:, None] * D + offs_d[None, :]) * 2
                s_c = tl.load(out_ptr + offs_out, mask=mask, other=0.0).to(tl.float32)
                s_h = tl.load(out_ptr + offs_out + 1, mask=mask, other=0.0).to(tl.float32)
                s_c, s_h, hist, k = _lstm_chunk(
                    s_c, s_h, c_in, h_in, u_f, u_z, u_o, a_f, a_z, a_o, p_f, p_o, mask, valid,
                    rows, before, hist, slots, tol, omega, MAX_ITERS, HIST,
                )  # fmt: skip
                most_iters = tl.maximum(most_iters, k)
                last = tl.minimum(c0 + BLOCK_T, t_end) - 1 - c0
                c_in, h_in = _store_chunk(out_ptr, offs_out, mask, s_c, s_h, rows, last)
                c0 += BLOCK_T
                slot = ((chunk_base + c0 // BLOCK_T) * D + offs_d) * 2
                live = c0 < t_end
                gap = tl.maximum(
                    _start_mismatch(chunk_ptr + slot, c_in, mask_d, live),
                    _start_mismatch(chunk_ptr + slot + 1, h_in, mask_d, live),
                )
            hist = tl.where(slots == HIST - 1, tl.maximum(hist, gap), hist)
            c = tl.where(c0 >= t_end, c_in, c)
            h = tl.where(c0 >= t_end, h_in, h)
        tl.store(end_ptr + seg_slot * 2, c, mask=mask_d)
        tl.store(end_ptr + seg_slot * 2 + 1, h, mask=mask_d)
        _publish_segment(sync_ptr, pid_d, pid_b, seg)
    _publish_stats(stats_ptr, hist, slots, most_iters, HIST)


@triton.jit
def _load_backward_chunk(
    u_ptr, grad_ptr, states_ptr, h0_c, h0_h, row_base, top, D, offs_d, mask_d,
    BLOCK_T: tl.constexpr,
):  # fmt: skip
    """Rows ``i`` = steps ``top - i``: gates, ``∂L/∂(c, h)`` and the consumed state (h0 at 0)."""
    t = top - tl.arange(0, BLOCK_T)
    mask = (t >= 0)[:, None] & mask_d[None, :]
    elem = (row_base + t)[:, None] * D + offs_d[None, :]
    offs_u = (row_base + t)[:, None] * (3 * D) + offs_d[None, :]
    u_f, u_z, u_o = _load_gates(u_ptr, offs_u, mask, D)
    g_c = tl.load(grad_ptr + elem * 2, mask=mask, other=0.0).to(tl.float32)
    g_h = tl.load(grad_ptr + elem * 2 + 1, mask=mask, other=0.0).to(tl.float32)
    has_prev = mask & (t >= 1)[:, None]
    prev_c = tl.load(states_ptr + (elem - D) * 2, mask=has_prev, other=0.0).to(tl.float32)
    prev_h = tl.load(states_ptr + (elem - D) * 2 + 1, mask=has_prev, other=0.0).to(tl.float32)
    first = (t == 0)[:, None]
    prev_c = tl.where(first, h0_c[None, :], prev_c)
    prev_h = tl.where(first, h0_h[None, :], prev_h)
    return u_f, u_z, u_o, g_c, g_h, prev_c, prev_h


@triton.jit
def lstm_backward_kernel(
    u_ptr,
    w_ptr,
    h0_ptr,
    states_ptr,
    grad_ptr,
    grad_u_ptr,
    grad_h0_ptr,
    grad_w_ptr,
    T,
    D,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Reverse pass; ``grad_w [5, B, cdiv(D, BLOCK_D)·BLOCK_D]`` gets this program's partials.

    Rows of a chunk run backwards in time (row i is step ``top - i``), so a forward associative
    scan over rows solves the reverse recurrence of ``ν`` (module docstring).
    """
    pid_d = tl.program_id(0)
    pid_b = tl.program_id(1)
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    rows = tl.arange(0, BLOCK_T)
    a_f, a_z, a_o, p_f, p_o = _load_weights(w_ptr, offs_d, mask_d, D)
    h0_slot = (pid_b.to(tl.int64) * D + offs_d) * 2
    h0_c = tl.load(h0_ptr + h0_slot, mask=mask_d, other=0.0).to(tl.float32)
    h0_h = tl.load(h0_ptr + h0_slot + 1, mask=mask_d, other=0.0).to(tl.float32)
    before = tl.maximum(rows - 1, 0)[:, None] + tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.int32)
    first_row = (rows == 0)[:, None]
    no_carry = tl.zeros([BLOCK_D], dtype=tl.float32)

    # ν at the step after this chunk's first row (zero after the last step).
    nu_c = tl.zeros([BLOCK_D], dtype=tl.float32)
    nu_h = tl.zeros([BLOCK_D], dtype=tl.float32)
    # Parameter-gradient partials per (row, channel), reduced over the rows once at the end
    # (a fixed order, so the result is deterministic).
    acc_af = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
    acc_az = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
    acc_ao = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
    acc_pf = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
    acc_po = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
    row_base = pid_b.to(tl.int64) * T
    n_f, n_z, n_o, n_gc, n_gh, n_pc, n_ph = _load_backward_chunk(
        u_ptr, grad_ptr, states_ptr, h0_c, h0_h, row_base, T - 1, D, offs_d, mask_d, BLOCK_T
    )
    for c0 in range(0, T, BLOCK_T):
        u_f, u_z, u_o, g_c, g_h, prev_c, prev_h = n_f, n_z, n_o, n_gc, n_gh, n_pc, n_ph
        n_f, n_z, n_o, n_gc, n_gh, n_pc, n_ph = _load_backward_chunk(
            u_ptr,
            grad_ptr,
            states_ptr,
            h0_c,
            h0_h,
            row_base,
            T - 1 - c0 - BLOCK_T,
            D,
            offs_d,
            mask_d,
            BLOCK_T,
        )
        t = (T - 1 - c0) - rows
        valid = t >= 0
        mask = valid[:, None] & mask_d[None, :]
        offs_u = (row_base + t)[:, None] * (3 * D) + offs_d[None, :]

        f, z, c_new, o, tc = _lstm_forward(prev_c, prev_h, u_f, u_z, u_o, a_f, a_z, a_o, p_f, p_o)
        j00, j01, j10, j11, s_o, d_out = _lstm_jacobian(
            prev_c, prev_h, f, z, o, tc, a_f, a_z, a_o, p_f, p_o
        )
        j00 = tl.where(mask, j00, 0.0)
        j01 = tl.where(mask, j01, 0.0)
        j10 = tl.where(mask, j10, 0.0)
        j11 = tl.where(mask, j11, 0.0)
        # ν_t = J_tᵀ (g_t + ν_{t+1}): the pair (J_tᵀ, J_tᵀ g_t) per row, the carry ν from the
        # chunk after folded into the first row's g, so the scan's vectors are ν itself and its
        # matrices go unused.
        g_c = g_c + tl.where(first_row, nu_c[None, :], 0.0)
        g_h = g_h + tl.where(first_row, nu_h[None, :], 0.0)
        _p00, _p01, _p10, _p11, nu_rows_c, nu_rows_h = tl.associative_scan(
            (j00, j10, j01, j11, j00 * g_c + j10 * g_h, j01 * g_c + j11 * g_h),
            0,
            _combine_block2,
        )
        mu_c = tl.where(mask, g_c + _shift_rows(nu_rows_c, before, rows, no_carry), 0.0)
        mu_h = tl.where(mask, g_h + _shift_rows(nu_rows_h, before, rows, no_carry), 0.0)

        # μ through h' = o tanh(c') and c' = z + f (c - z) to the gate pre-activations.
        gu_o = mu_h * s_o
        mu_cell = mu_c + mu_h * d_out
        gu_f = mu_cell * f * (1.0 - f) * (prev_c - z)
        gu_z = mu_cell * (1.0 - f) * (1.0 - z * z)
        tl.store(grad_u_ptr + offs_u, gu_f.to(grad_u_ptr.dtype.element_ty), mask=mask)
        tl.store(grad_u_ptr + offs_u + D, gu_z.to(grad_u_ptr.dtype.element_ty), mask=mask)
        tl.store(grad_u_ptr + offs_u + 2 * D, gu_o.to(grad_u_ptr.dtype.element_ty), mask=mask)
        acc_af += gu_f * prev_h
        acc_az += gu_z * prev_h
        acc_ao += gu_o * prev_h
        acc_pf += gu_f * prev_c
        acc_po += gu_o * c_new

        if T - 1 - c0 < BLOCK_T:  # the chunk holding step 0: ∂L/∂h0 = ν_0
            h0_out = (pid_b.to(tl.int64) * D + offs_d) * 2
            is_first = (t == 0)[:, None]
            g0_c = tl.sum(tl.where(is_first, nu_rows_c, 0.0), axis=0)
            g0_h = tl.sum(tl.where(is_first, nu_rows_h, 0.0), axis=0)
            tl.store(grad_h0_ptr + h0_out, g0_c.to(grad_h0_ptr.dtype.element_ty), mask=mask_d)
            tl.store(grad_h0_ptr + h0_out + 1, g0_h.to(grad_h0_ptr.dtype.element_ty), mask=mask_d)
        nu_c = _pick_row(nu_rows_c, rows, BLOCK_T - 1)
        nu_h = _pick_row(nu_rows_h, rows, BLOCK_T - 1)

    slot, row_stride = _partial_slots(BLOCK_D)
    tl.store(grad_w_ptr + slot, tl.sum(acc_af, axis=0))
    tl.store(grad_w_ptr + slot + row_stride, tl.sum(acc_az, axis=0))
    tl.store(grad_w_ptr + slot + 2 * row_stride, tl.sum(acc_ao, axis=0))
    tl.store(grad_w_ptr + slot + 3 * row_stride, tl.sum(acc_pf, axis=0))
    tl.store(grad_w_ptr + slot + 4 * row_stride, tl.sum(acc_po, axis=0))


@triton.jit
def lstm_sequential_kernel(
    u_ptr,
    w_ptr,
    h0_ptr,
    out_ptr,
    T,
    D,
    ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
    VEC: tl.constexpr,
):
    """``(c, h)_t = f((c, h)_{t-1}, u_t)`` one step at a time, ``ROWS`` steps per loaded and
    stored tile, ``VEC`` channels per thread at most (see ``gru_sequential_kernel``)."""
    pid_d = tl.program_id(0)
    pid_b = tl.program_id(1)
    offs_d = tl.max_contiguous(pid_d * BLOCK_D + tl.arange(0, BLOCK_D), VEC)
    mask_d = offs_d < D
    rows = tl.arange(0, ROWS)
    a_f, a_z, a_o, p_f, p_o = _load_weights(w_ptr, offs_d, mask_d, D)
    h0_slot = (pid_b.to(tl.int64) * D + offs_d) * 2
    c = tl.load(h0_ptr + h0_slot, mask=mask_d, other=0.0).to(tl.float32)
    h = tl.load(h0_ptr + h0_slot + 1, mask=mask_d, other=0.0).to(tl.float32)
    row_base = pid_b.to(tl.int64) * T
    n_f, n_z, n_o = _load_chunk(u_ptr, row_base, 0, T, D, offs_d, mask_d, ROWS)
    for c0 in range(0, T, ROWS):
        g_f, g_z, g_o = n_f, n_z, n_o
        n_f, n_z, n_o = _load_chunk(u_ptr, row_base, c0 + ROWS, T, D, offs_d, mask_d, ROWS)
        block_c = tl.zeros([ROWS, BLOCK_D], dtype=tl.float32)
        block_h = tl.zeros([ROWS, BLOCK_D], dtype=tl.float32)
        for r in tl.static_range(ROWS):
            _f, _z, c, o, tc = _lstm_forward(
                c,
                h,
                _pick_row(g_f, rows, r),
                _pick_row(g_z, rows, r),
                _pick_row(g_o, rows, r),
                a_f,
                a_z,
                a_o,
                p_f,
                p_o,
            )
            h = o * tc
            here = (rows == r)[:, None]
            block_c = tl.where(here, c[None, :], block_c)
            block_h = tl.where(here, h[None, :], block_h)
        t = c0 + rows
        mask = (t < T)[:, None] & mask_d[None, :]
        out = ((row_base + t)[:, None] * D + offs_d[None, :]) * 2
        tl.store(out_ptr + out, block_c.to(out_ptr.dtype.element_ty), mask=mask)
        tl.store(out_ptr + out + 1, block_h.to(out_ptr.dtype.element_ty), mask=mask)
