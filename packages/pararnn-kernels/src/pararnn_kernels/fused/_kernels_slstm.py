"""Triton kernels of the fused ParaSLSTM(mix="diag") layer (kernel-only module: no public API).

The cell (``pararnn_core.ParaSLSTM``, log-normaliser form; ``u = [u_z, u_i, u_f, u_o]`` along the
last axis, recurrent rows ``w = [r_z, r_i, r_f, r_o]`` of shape ``[4, D]``)::

    z = tanh(u_z + r_z h),  ĩ = u_i + r_i h,  f̃ = u_f + r_f h,  o = σ(u_o + r_o h)
    ℓ' = logaddexp(log σ(f̃) + ℓ, ĩ),  λ = exp(ĩ - ℓ'),  ĉ' = ĉ + λ (z - ĉ),  h' = o ĉ'

State per channel ``(ĉ, ℓ, h)``; the Jacobian is a 3x3 block per channel, rows ``(ĉ', ℓ', h')``,
columns ``(ĉ, ℓ, h)`` (the matrix is in ``pararnn_core.ParaSLSTM``'s docstring). The empty state
is ``ĉ = h = 0``, ``ℓ = EMPTY_LOG_NORMALISER``. Layouts: ``u [B, T, 4D]``, states
``[B, T, D, 3]``, ``h0 [B, D, 3]``, contiguous; arithmetic in float32.

The kernels are the LSTM's (``_kernels_lstm``) with 3x3 blocks: the Newton scan runs on twelve
tiles (nine block entries and three vector entries), the backward scan on ``ν_t = J_tᵀ μ_t``.
"""

import triton
import triton.language as tl

from ._kernels import (
    _combine,
    _exp,
    _first_row_carry,
    _log,
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
from .slstm import SLSTM_EMPTY_LOG_NORMALISER

EMPTY_LOG_NORMALISER = tl.constexpr(SLSTM_EMPTY_LOG_NORMALISER)


@triton.jit
def _matmul3(
    a00, a01, a02, a10, a11, a12, a20, a21, a22,
    c00, c01, c02, c10, c11, c12, c20, c21, c22,
):  # fmt: skip
    # Product of 3x3 blocks, the earlier (a) on the right: C A.
    return (
        c00 * a00 + c01 * a10 + c02 * a20,
        c00 * a01 + c01 * a11 + c02 * a21,
        c00 * a02 + c01 * a12 + c02 * a22,
        c10 * a00 + c11 * a10 + c12 * a20,
        c10 * a01 + c11 * a11 + c12 * a21,
        c10 * a02 + c11 * a12 + c12 * a22,
        c20 * a00 + c21 * a10 + c22 * a20,
        c20 * a01 + c21 * a11 + c22 * a21,
        c20 * a02 + c21 * a12 + c22 * a22,
    )


@triton.jit
def _combine_block3(
    a00, a01, a02, a10, a11, a12, a20, a21, a22, b0, b1, b2,
    c00, c01, c02, c10, c11, c12, c20, c21, c22, d0, d1, d2,
):  # fmt: skip
    # The pair monoid of y_t = A_t y_{t-1} + b_t with 3x3 blocks; (a, b) is the earlier pair.
    p00, p01, p02, p10, p11, p12, p20, p21, p22 = _matmul3(
        a00, a01, a02, a10, a11, a12, a20, a21, a22,
        c00, c01, c02, c10, c11, c12, c20, c21, c22,
    )  # fmt: skip
    return (
        p00, p01, p02, p10, p11, p12, p20, p21, p22,
        c00 * b0 + c01 * b1 + c02 * b2 + d0,
        c10 * b0 + c11 * b1 + c12 * b2 + d1,
        c20 * b0 + c21 * b1 + c22 * b2 + d2,
    )  # fmt: skip


@triton.jit
def _log_sigmoid(x):
    # log σ(x) = min(x, 0) - log(1 + e^{-|x|}), finite for every finite x.
    return tl.minimum(x, 0.0) - _log(1.0 + _exp(-tl.abs(x)))


@triton.jit
def _logaddexp(a, b):
    # A NaN in a or b reaches the result through |a - b| (tl.maximum would drop it).
    return tl.maximum(a, b) + _log(1.0 + _exp(-tl.abs(a - b)))


@triton.jit
def _slstm_forward(c, ell, h, u_z, u_i, u_f, u_o, r_z, r_i, r_f, r_o):
    z = _tanh(u_z + r_z * h)
    i_pre = u_i + r_i * h
    f_pre = u_f + r_f * h
    o = _sigmoid(u_o + r_o * h)
    ell_new = _logaddexp(_log_sigmoid(f_pre) + ell, i_pre)
    lam = _exp(i_pre - ell_new)
    c_new = c + lam * (z - c)
    return z, f_pre, o, ell_new, lam, c_new


@triton.jit
def _slstm_jacobian(c, z, f_pre, o, lam, c_new, r_z, r_i, r_f, r_o):
    """The 3x3 block ``∂(ĉ', ℓ', h')/∂(ĉ, ℓ, h)`` row by row (entry (1, 0) is zero)."""
    keep = 1.0 - lam
    gap = z - c
    g = lam * r_i + keep * _sigmoid(-f_pre) * r_f
    j01 = -gap * lam * keep
    j02 = gap * lam * (r_i - g) + lam * (1.0 - z * z) * r_z
    j22 = o * j02 + c_new * o * (1.0 - o) * r_o
    return keep, j01, j02, keep * 0.0, keep, g, o * keep, o * j01, j22


@triton.jit
def _load_gates(u_ptr, offs_u, mask, D):
    u_z = tl.load(u_ptr + offs_u, mask=mask, other=0.0).to(tl.float32)
    u_i = tl.load(u_ptr + offs_u + D, mask=mask, other=0.0).to(tl.float32)
    u_f = tl.load(u_ptr + offs_u + 2 * D, mask=mask, other=0.0).to(tl.float32)
    u_o = tl.load(u_ptr + offs_u + 3 * D, mask=mask, other=0.0).to(tl.float32)
    return u_z, u_i, u_f, u_o


@triton.jit
def _load_weights(w_ptr, offs_d, mask_d, D):
    r_z = tl.load(w_ptr + offs_d, mask=mask_d, other=0.0).to(tl.float32)
    r_i = tl.load(w_ptr + D + offs_d, mask=mask_d, other=0.0).to(tl.float32)
    r_f = tl.load(w_ptr + 2 * D + offs_d, mask=mask_d, other=0.0).to(tl.float32)
    r_o = tl.load(w_ptr + 3 * D + offs_d, mask=mask_d, other=0.0).to(tl.float32)
    return r_z, r_i, r_f, r_o


@triton.jit
def _load_chunk(u_ptr, row_base, c0, t_end, D, offs_d, mask_d, BLOCK_T: tl.constexpr):
    t = c0 + tl.arange(0, BLOCK_T)
    mask = (t < t_end)[:, None] & mask_d[None, :]
    offs_u = (row_base + t)[:, None] * (4 * D) + offs_d[None, :]
    return _load_gates(u_ptr, offs_u, mask, D)


@triton.jit
def _identity_past_end(valid, j00, j01, j02, j10, j11, j12, j20, j21, j22):
    # Rows past the end multiply by the identity, so the scans stay exact.
    v = valid[:, None]
    return (
        tl.where(v, j00, 1.0), tl.where(v, j01, 0.0), tl.where(v, j02, 0.0),
        tl.where(v, j10, 0.0), tl.where(v, j11, 1.0), tl.where(v, j12, 0.0),
        tl.where(v, j20, 0.0), tl.where(v, j21, 0.0), tl.where(v, j22, 1.0),
    )  # fmt: skip


@triton.jit
def _slstm_guess(u_z, u_i, u_f, u_o, r_z, r_i, r_f, r_o, GUESS: tl.constexpr):
    """The one-row initial guess ``(c, ℓ, h)``: one step from the empty state (``GUESS`` 1 or
    2) or the empty state (``GUESS=0``)."""
    empty = tl.zeros_like(u_z)
    empty_ell = tl.full(u_z.shape, EMPTY_LOG_NORMALISER, dtype=tl.float32)
    if GUESS >= 1:
        _z, _fp, o, ell, _lam, c = _slstm_forward(
            empty, empty_ell, empty, u_z, u_i, u_f, u_o, r_z, r_i, r_f, r_o
        )
        return c, ell, o * c
    else:
        return empty, empty_ell, empty


@triton.jit
def _combine_log(a_left, b_left, a_right, b_right):
    # The pair monoid of ℓ_t = logaddexp(a_t + ℓ_{t-1}, b_t); `left` is earlier.
    return a_left + a_right, _logaddexp(a_right + b_left, b_right)


@triton.jit
def _slstm_uncoupled(u_z, u_i, u_f, u_o, c, ell, rows):
    """A chunk's states ``(ĉ, ℓ, h)`` with the recurrent weights dropped (``GUESS=2``), solved
    from the exact ``(ĉ, ℓ)`` before it: ``ℓ_t = logaddexp(log σ(u_f) + ℓ_{t-1}, u_i)`` (a scan
    in log space), ``λ_t = exp(u_i - ℓ_t)``, ``ĉ_t = (1 - λ_t) ĉ_{t-1} + λ_t tanh(u_z)`` (a
    second scan), ``h_t = σ(u_o) ĉ_t``."""
    log_f = _log_sigmoid(u_f)
    first = (rows == 0)[:, None]
    _sum, s_l = tl.associative_scan(
        (log_f, tl.where(first, _logaddexp(log_f + ell[None, :], u_i), u_i)), 0, _combine_log
    )
    lam = _exp(u_i - s_l)
    keep = 1.0 - lam
    _prod, s_c = tl.associative_scan(
        (keep, _first_row_carry(keep, lam * _tanh(u_z), rows, c)), 0, _combine
    )
    return s_c, s_l, _sigmoid(u_o) * s_c


@triton.jit
def _slstm_chunk(
    s_c, s_l, s_h, c, ell, h, u_z, u_i, u_f, u_o, r_z, r_i, r_f, r_o, mask, valid, rows, before,
    hist, slots, tol, omega, MAX_ITERS: tl.constexpr, HIST: tl.constexpr,
):  # fmt: skip
    """Newton on one chunk from the guess ``(s_c, s_l, s_h)`` and the exact state
    ``(c, ell, h)`` before it: ``(s_c, s_l, s_h, hist, updates)`` (as ``_kernels._gru_chunk``)."""
    k = 0
    done = 0
    while done == 0:
        prev_c = _shift_rows(s_c, before, rows, c)
        prev_l = _shift_rows(s_l, before, rows, ell)
        prev_h = _shift_rows(s_h, before, rows, h)
        z, f_pre, o, ell_new, lam, c_new = _slstm_forward(
            prev_c, prev_l, prev_h, u_z, u_i, u_f, u_o, r_z, r_i, r_f, r_o
        )
        j00, j01, j02, j10, j11, j12, j20, j21, j22 = _slstm_jacobian(
            prev_c, z, f_pre, o, lam, c_new, r_z, r_i, r_f, r_o
        )
        r_c = tl.where(mask, c_new - s_c, 0.0)
        r_l = tl.where(mask, ell_new - s_l, 0.0)
        r_h = tl.where(mask, o * c_new - s_h, 0.0)
        # One reduction over the tile for all components (each crosses the warps once).
        size = tl.maximum(tl.maximum(_residual_size(r_c), _residual_size(r_l)), _residual_size(r_h))
        worst = _tile_max(size)
        hist, done = _record_residual(hist, slots, k, worst, tol, MAX_ITERS, HIST)
        if done == 0:
            m00, m01, m02, m10, m11, m12, m20, m21, m22 = _identity_past_end(
                valid, j00, j01, j02, j10, j11, j12, j20, j21, j22
            )
            _p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, d_c, d_l, d_h = tl.associative_scan(
                (m00, m01, m02, m10, m11, m12, m20, m21, m22, r_c, r_l, r_h),
                0,
                _combine_block3,
            )
            s_c = s_c + omega * d_c
            s_l = s_l + omega * d_l
            s_h = s_h + omega * d_h
            k += 1
    return s_c, s_l, s_h, hist, k


@triton.jit
def _chunk_start_mismatch(chunk_ptr, slot, c, ell, h, mask_d, live):
    """The largest start mismatch over the three components (``_start_mismatch``)."""
    return tl.maximum(
        tl.maximum(
            _start_mismatch(chunk_ptr + slot, c, mask_d, live),
            _start_mismatch(chunk_ptr + slot + 1, ell, mask_d, live),
        ),
        _start_mismatch(chunk_ptr + slot + 2, h, mask_d, live),
    )


@triton.jit
def _store_chunk(out_ptr, offs_out, mask, s_c, s_l, s_h, rows, last):
    """Store a chunk's solved states; its end state ``(c, ℓ, h)`` (row ``last``)."""
    tl.store(out_ptr + offs_out, s_c.to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(out_ptr + offs_out + 1, s_l.to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(out_ptr + offs_out + 2, s_h.to(out_ptr.dtype.element_ty), mask=mask)
    return _pick_row(s_c, rows, last), _pick_row(s_l, rows, last), _pick_row(s_h, rows, last)


@triton.jit
def slstm_newton_kernel(
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
    """``h0 [B, D, 3]`` (``start``) -> states ``out [B, T, D, 3]``; ``end [S, B, D, 3]``,
    ``chunk [B, n_chunks, D, 3]``, ``sync``, ``GUESS`` and ``stats`` as in
    ``gru_newton_kernel`` (``GUESS=0``: the empty state; ``GUESS=1``: one step from it;
    ``GUESS=2``: ``_slstm_uncoupled``)."""
    pid_d, pid_b, seg = _segment_program(sync_ptr, CHAINED)
    n_b = tl.num_programs(1)
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    rows = tl.arange(0, BLOCK_T)
    r_z, r_i, r_f, r_o = _load_weights(w_ptr, offs_d, mask_d, D)

    seg_slot = (seg.to(tl.int64) * n_b + pid_b) * D + offs_d
    start = (pid_b.to(tl.int64) * D + offs_d) * 3
    c = tl.load(start_ptr + start, mask=mask_d, other=0.0).to(tl.float32)
    ell = tl.load(start_ptr + start + 1, mask=mask_d, other=0.0).to(tl.float32)
    h = tl.load(start_ptr + start + 2, mask=mask_d, other=0.0).to(tl.float32)
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
        before_row = (row_base + tl.maximum(t_begin - 1, 0)) * (4 * D) + offs_d
        g_z, g_i, g_f, g_o = _load_gates(u_ptr, before_row, mask_d, D)
        g_c, g_l, g_h = _slstm_guess(g_z, g_i, g_f, g_o, r_z, r_i, r_f, r_o, GUESS)
        c = tl.where(seg > 0, g_c, c)
        ell = tl.where(seg > 0, g_l, ell)
        h = tl.where(seg > 0, g_h, h)
    n_z, n_i, n_f, n_o = _load_chunk(u_ptr, row_base, t_begin, t_end, D, offs_d, mask_d, BLOCK_T)
    for c0 in range(t_begin, t_end, BLOCK_T):
        u_z, u_i, u_f, u_o = n_z, n_i, n_f, n_o
        n_z, n_i, n_f, n_o = _load_chunk(
            u_ptr, row_base, c0 + BLOCK_T, t_end, D, offs_d, mask_d, BLOCK_T
        )
        t = c0 + rows
        valid = t < t_end
        mask = valid[:, None] & mask_d[None, :]
        offs_out = ((row_base + t)[:, None] * D + offs_d[None, :]) * 3
        if GUESS == 2:
            s_c, s_l, s_h = _slstm_uncoupled(u_z, u_i, u_f, u_o, c, ell, rows)
        else:
            s_c, s_l, s_h = _slstm_guess(u_z, u_i, u_f, u_o, r_z, r_i, r_f, r_o, GUESS)
        if CHAINED:
            slot = ((chunk_base + c0 // BLOCK_T) * D + offs_d) * 3
            tl.store(chunk_ptr + slot, c, mask=mask_d)
            tl.store(chunk_ptr + slot + 1, ell, mask=mask_d)
            tl.store(chunk_ptr + slot + 2, h, mask=mask_d)
        s_c, s_l, s_h, hist, k = _slstm_chunk(
            s_c, s_l, s_h, c, ell, h, u_z, u_i, u_f, u_o, r_z, r_i, r_f, r_o, mask, valid, rows,
            before, hist, slots, tol, omega, MAX_ITERS, HIST,
        )  # fmt: skip
        most_iters = tl.maximum(most_iters, k)
        last = tl.minimum(c0 + BLOCK_T, t_end) - 1 - c0
        c, ell, h = _store_chunk(out_ptr, offs_out, mask, s_c, s_l, s_h, rows, last)

    if CHAINED:
        if seg > 0:
            # The segment's correcting walk (as in gru_newton_kernel).
            tl.debug_barrier()
            _wait_for_segment_before(sync_ptr, pid_d, pid_b, seg)
            prev_slot = (seg_slot - n_b * D) * 3
            c_in = tl.load(end_ptr + prev_slot, mask=mask_d, other=0.0, volatile=True)
            l_in = tl.load(end_ptr + prev_slot + 1, mask=mask_d, other=0.0, volatile=True)
            h_in = tl.load(end_ptr + prev_slot + 2, mask=mask_d, other=0.0, volatile=True)
            c0 = t_begin
            slot = ((chunk_base + c0 // BLOCK_T) * D + offs_d) * 3
            gap = _chunk_start_mismatch(chunk_ptr, slot, c_in, l_in, h_in, mask_d, c0 < t_end)
            while gap > tol:
                u_z, u_i, u_f, u_o = _load_chunk(
                    u_ptr, row_base, c0, t_end, D, offs_d, mask_d, BLOCK_T
                )
                t = c0 + rows
                valid = t < t_end
                mask = valid[:, None] & mask_d[None, :]
                offs_out = ((row_base + t)[:, None] * D + offs_d[None, :]) * 3
                s_c = tl.load(out_ptr + offs_out, mask=mask, other=0.0).to(tl.float32)
                s_l = tl.load(out_ptr + offs_out + 1, mask=mask, other=0.0).to(tl.float32)
                s_h = tl.load(out_ptr + offs_out + 2, mask=mask, other=0.0).to(tl.float32)
                s_c, s_l, s_h, hist, k = _slstm_chunk(
                    s_c, s_l, s_h, c_in, l_in, h_in, u_z, u_i, u_f, u_o, r_z, r_i, r_f, r_o,
                    mask, valid, rows, before, hist, slots, tol, omega, MAX_ITERS, HIST,
                )  # fmt: skip
                most_iters = tl.maximum(most_iters, k)
                last = tl.minimum(c0 + BLOCK_T, t_end) - 1 - c0
                c_in, l_in, h_in = _store_chunk(out_ptr, offs_out, mask, s_c, s_l, s_h, rows, last)
                c0 += BLOCK_T
                slot = ((chunk_base + c0 // BLOCK_T) * D + offs_d) * 3
                gap = _chunk_start_mismatch(chunk_ptr, slot, c_in, l_in, h_in, mask_d, c0 < t_end)
            hist = tl.where(slots == HIST - 1, tl.maximum(hist, gap), hist)
            c = tl.where(c0 >= t_end, c_in, c)
            ell = tl.where(c0 >= t_end, l_in, ell)
            h = tl.where(c0 >= t_end, h_in, h)
        tl.store(end_ptr + seg_slot * 3, c, mask=mask_d)
        tl.store(end_ptr + seg_slot * 3 + 1, ell, mask=mask_d)
        tl.store(end_ptr + seg_slot * 3 + 2, h, mask=mask_d)
        _publish_segment(sync_ptr, pid_d, pid_b, seg)
    _publish_stats(stats_ptr, hist, slots, most_iters, HIST)


@triton.jit
def _load_backward_chunk(
    u_ptr, grad_ptr, states_ptr, h0_c, h0_l, h0_h, row_base, top, D, offs_d, mask_d,
    BLOCK_T: tl.constexpr,
):  # fmt: skip
    """Rows ``i`` = steps ``top - i``: gates, ``∂L/∂(ĉ, ℓ, h)`` and the consumed state."""
    t = top - tl.arange(0, BLOCK_T)
    mask = (t >= 0)[:, None] & mask_d[None, :]
    elem = (row_base + t)[:, None] * D + offs_d[None, :]
    offs_u = (row_base + t)[:, None] * (4 * D) + offs_d[None, :]
    u_z, u_i, u_f, u_o = _load_gates(u_ptr, offs_u, mask, D)
    g_c = tl.load(grad_ptr + elem * 3, mask=mask, other=0.0).to(tl.float32)
    g_l = tl.load(grad_ptr + elem * 3 + 1, mask=mask, other=0.0).to(tl.float32)
    g_h = tl.load(grad_ptr + elem * 3 + 2, mask=mask, other=0.0).to(tl.float32)
    has_prev = mask & (t >= 1)[:, None]
    prev = states_ptr + (elem - D) * 3
    prev_c = tl.load(prev, mask=has_prev, other=0.0).to(tl.float32)
    prev_l = tl.load(prev + 1, mask=has_prev, other=0.0).to(tl.float32)
    prev_h = tl.load(prev + 2, mask=has_prev, other=0.0).to(tl.float32)
    first = (t == 0)[:, None]
    prev_c = tl.where(first, h0_c[None, :], prev_c)
    prev_l = tl.where(first, h0_l[None, :], prev_l)
    prev_h = tl.where(first, h0_h[None, :], prev_h)
    return u_z, u_i, u_f, u_o, g_c, g_l, g_h, prev_c, prev_l, prev_h


@triton.jit
def slstm_backward_kernel(
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
    """Reverse pass; ``grad_w [4, B, cdiv(D, BLOCK_D)·BLOCK_D]`` gets this program's partials
    (rows backwards in time, the scan on ``ν``, as ``lstm_backward_kernel``)."""
    pid_d = tl.program_id(0)
    pid_b = tl.program_id(1)
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    rows = tl.arange(0, BLOCK_T)
    r_z, r_i, r_f, r_o = _load_weights(w_ptr, offs_d, mask_d, D)
    h0_slot = (pid_b.to(tl.int64) * D + offs_d) * 3
    h0_c = tl.load(h0_ptr + h0_slot, mask=mask_d, other=0.0).to(tl.float32)
    h0_l = tl.load(h0_ptr + h0_slot + 1, mask=mask_d, other=0.0).to(tl.float32)
    h0_h = tl.load(h0_ptr + h0_slot + 2, mask=mask_d, other=0.0).to(tl.float32)
    before = tl.maximum(rows - 1, 0)[:, None] + tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.int32)
    first_row = (rows == 0)[:, None]
    no_carry = tl.zeros([BLOCK_D], dtype=tl.float32)

    nu_c = tl.zeros([BLOCK_D], dtype=tl.float32)
    nu_l = tl.zeros([BLOCK_D], dtype=tl.float32)
    nu_h = tl.zeros([BLOCK_D], dtype=tl.float32)
    acc_z = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
    acc_i = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
    acc_f = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
    acc_o = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
    row_base = pid_b.to(tl.int64) * T
    n_z, n_i, n_f, n_o, n_gc, n_gl, n_gh, n_pc, n_pl, n_ph = _load_backward_chunk(
        u_ptr, grad_ptr, states_ptr, h0_c, h0_l, h0_h, row_base, T - 1, D, offs_d, mask_d,
        BLOCK_T,
    )  # fmt: skip
    for c0 in range(0, T, BLOCK_T):
        u_z, u_i, u_f, u_o = n_z, n_i, n_f, n_o
        g_c, g_l, g_h, prev_c, prev_l, prev_h = n_gc, n_gl, n_gh, n_pc, n_pl, n_ph
        n_z, n_i, n_f, n_o, n_gc, n_gl, n_gh, n_pc, n_pl, n_ph = _load_backward_chunk(
            u_ptr, grad_ptr, states_ptr, h0_c, h0_l, h0_h, row_base, T - 1 - c0 - BLOCK_T, D,
            offs_d, mask_d, BLOCK_T,
        )  # fmt: skip
        t = (T - 1 - c0) - rows
        valid = t >= 0
        mask = valid[:, None] & mask_d[None, :]
        offs_u = (row_base + t)[:, None] * (4 * D) + offs_d[None, :]

        z, f_pre, o, _ell_new, lam, c_new = _slstm_forward(
            prev_c, prev_l, prev_h, u_z, u_i, u_f, u_o, r_z, r_i, r_f, r_o
        )
        j00, j01, j02, j10, j11, j12, j20, j21, j22 = _slstm_jacobian(
            prev_c, z, f_pre, o, lam, c_new, r_z, r_i, r_f, r_o
        )
        j00 = tl.where(mask, j00, 0.0)
        j01 = tl.where(mask, j01, 0.0)
        j02 = tl.where(mask, j02, 0.0)
        j10 = tl.where(mask, j10, 0.0)
        j11 = tl.where(mask, j11, 0.0)
        j12 = tl.where(mask, j12, 0.0)
        j20 = tl.where(mask, j20, 0.0)
        j21 = tl.where(mask, j21, 0.0)
        j22 = tl.where(mask, j22, 0.0)
        # ν_t = J_tᵀ (g_t + ν_{t+1}): the pair (J_tᵀ, J_tᵀ g_t) per row, the carry ν from the
        # chunk after folded into the first row's g, so the scan's vectors are ν itself and its
        # matrices go unused.
        g_c = g_c + tl.where(first_row, nu_c[None, :], 0.0)
        g_l = g_l + tl.where(first_row, nu_l[None, :], 0.0)
        g_h = g_h + tl.where(first_row, nu_h[None, :], 0.0)
        _p0, _p1, _p2, _p3, _p4, _p5, _p6, _p7, _p8, nu_rows_c, nu_rows_l, nu_rows_h = (
            tl.associative_scan(
                (
                    j00, j10, j20, j01, j11, j21, j02, j12, j22,
                    j00 * g_c + j10 * g_l + j20 * g_h,
                    j01 * g_c + j11 * g_l + j21 * g_h,
                    j02 * g_c + j12 * g_l + j22 * g_h,
                ),
                0,
                _combine_block3,
            )
        )  # fmt: skip
        mu_c = tl.where(mask, g_c + _shift_rows(nu_rows_c, before, rows, no_carry), 0.0)
        mu_l = tl.where(mask, g_l + _shift_rows(nu_rows_l, before, rows, no_carry), 0.0)
        mu_h = tl.where(mask, g_h + _shift_rows(nu_rows_h, before, rows, no_carry), 0.0)

        # μ through h' = o ĉ', ĉ' = ĉ + λ (z - ĉ), λ = exp(ĩ - ℓ') and ℓ' = logaddexp(...).
        gu_o = mu_h * c_new * o * (1.0 - o)
        mu_cell = mu_c + mu_h * o
        gu_z = mu_cell * lam * (1.0 - z * z)
        mu_lam = mu_cell * (z - prev_c)
        mu_ell = mu_l - mu_lam * lam
        gu_i = lam * (mu_lam + mu_ell)
        gu_f = mu_ell * (1.0 - lam) * _sigmoid(-f_pre)
        ty = grad_u_ptr.dtype.element_ty
        tl.store(grad_u_ptr + offs_u, gu_z.to(ty), mask=mask)
        tl.store(grad_u_ptr + offs_u + D, gu_i.to(ty), mask=mask)
        tl.store(grad_u_ptr + offs_u + 2 * D, gu_f.to(ty), mask=mask)
        tl.store(grad_u_ptr + offs_u + 3 * D, gu_o.to(ty), mask=mask)
        acc_z += gu_z * prev_h
        acc_i += gu_i * prev_h
        acc_f += gu_f * prev_h
        acc_o += gu_o * prev_h

        if T - 1 - c0 < BLOCK_T:  # the chunk holding step 0: ∂L/∂h0 = ν_0
            h0_out = grad_h0_ptr + (pid_b.to(tl.int64) * D + offs_d) * 3
            is_first = (t == 0)[:, None]
            ty0 = grad_h0_ptr.dtype.element_ty
            g0_c = tl.sum(tl.where(is_first, nu_rows_c, 0.0), axis=0)
            g0_l = tl.sum(tl.where(is_first, nu_rows_l, 0.0), axis=0)
            g0_h = tl.sum(tl.where(is_first, nu_rows_h, 0.0), axis=0)
            tl.store(h0_out, g0_c.to(ty0), mask=mask_d)
            tl.store(h0_out + 1, g0_l.to(ty0), mask=mask_d)
            tl.store(h0_out + 2, g0_h.to(ty0), mask=mask_d)
        nu_c = _pick_row(nu_rows_c, rows, BLOCK_T - 1)
        nu_l = _pick_row(nu_rows_l, rows, BLOCK_T - 1)
        nu_h = _pick_row(nu_rows_h, rows, BLOCK_T - 1)

    slot, row_stride = _partial_slots(BLOCK_D)
    tl.store(grad_w_ptr + slot, tl.sum(acc_z, axis=0))
    tl.store(grad_w_ptr + slot + row_stride, tl.sum(acc_i, axis=0))
    tl.store(grad_w_ptr + slot + 2 * row_stride, tl.sum(acc_f, axis=0))
    tl.store(grad_w_ptr + slot + 3 * row_stride, tl.sum(acc_o, axis=0))


@triton.jit
def slstm_sequential_kernel(
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
    """``(ĉ, ℓ, h)_t = f((ĉ, ℓ, h)_{t-1}, u_t)`` one step at a time, ``ROWS`` steps per loaded
    and stored tile, ``VEC`` channels per thread at most (see ``gru_sequential_kernel``)."""
    pid_d = tl.program_id(0)
    pid_b = tl.program_id(1)
    offs_d = tl.max_contiguous(pid_d * BLOCK_D + tl.arange(0, BLOCK_D), VEC)
    mask_d = offs_d < D
    rows = tl.arange(0, ROWS)
    r_z, r_i, r_f, r_o = _load_weights(w_ptr, offs_d, mask_d, D)
    h0_slot = (pid_b.to(tl.int64) * D + offs_d) * 3
    c = tl.load(h0_ptr + h0_slot, mask=mask_d, other=0.0).to(tl.float32)
    ell = tl.load(h0_ptr + h0_slot + 1, mask=mask_d, other=0.0).to(tl.float32)
    h = tl.load(h0_ptr + h0_slot + 2, mask=mask_d, other=0.0).to(tl.float32)
    row_base = pid_b.to(tl.int64) * T
    n_z, n_i, n_f, n_o = _load_chunk(u_ptr, row_base, 0, T, D, offs_d, mask_d, ROWS)
    for c0 in range(0, T, ROWS):
        g_z, g_i, g_f, g_o = n_z, n_i, n_f, n_o
        n_z, n_i, n_f, n_o = _load_chunk(u_ptr, row_base, c0 + ROWS, T, D, offs_d, mask_d, ROWS)
        block_c = tl.zeros([ROWS, BLOCK_D], dtype=tl.float32)
        block_ell = tl.zeros([ROWS, BLOCK_D], dtype=tl.float32)
        block_h = tl.zeros([ROWS, BLOCK_D], dtype=tl.float32)
        for r in tl.static_range(ROWS):
            _z, _fp, o, ell, _lam, c = _slstm_forward(
                c,
                ell,
                h,
                _pick_row(g_z, rows, r),
                _pick_row(g_i, rows, r),
                _pick_row(g_f, rows, r),
                _pick_row(g_o, rows, r),
                r_z,
                r_i,
                r_f,
                r_o,
            )
            h = o * c
            here = (rows == r)[:, None]
            block_c = tl.where(here, c[None, :], block_c)
            block_ell = tl.where(here, ell[None, :], block_ell)
            block_h = tl.where(here, h[None, :], block_h)
        t = c0 + rows
        mask = (t < T)[:, None] & mask_d[None, :]
        out = ((row_base + t)[:, None] * D + offs_d[None, :]) * 3
        tl.store(out_ptr + out, block_c.to(out_ptr.dtype.element_ty), mask=mask)
        tl.store(out_ptr + out + 1, block_ell.to(out_ptr.dtype.element_ty), mask=mask)
        tl.store(out_ptr + out + 2, block_h.to(out_ptr.dtype.element_ty), mask=mask)
