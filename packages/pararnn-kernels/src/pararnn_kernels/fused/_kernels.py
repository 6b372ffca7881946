"""Triton kernels of the fused diagonal-GRU layer (kernel-only module: no types, no public API).

The cell (``pararnn_core.ParaGRU``; ``u = [u_z, u_r, u_c]`` along the last axis, weights
``w = [a_z, a_r, a_c]`` of shape ``[3, D]``)::

    z = σ(u_z + a_z h),  r = σ(u_r + a_r h),  c = tanh(u_c + a_c r h),  f = h + z (c - h)

Layouts: ``u [B, T, 3D]``, states ``[B, T, D]``, ``h0 [B, D]``, all contiguous; arithmetic in
float32 whatever the storage dtype.

* ``gru_newton_kernel`` -- grid ``(cdiv(D, BLOCK_D), B, S)``: program ``(d, b, s)`` owns the
  channels of block d of sequence b over time segment s and walks it in chunks of ``BLOCK_T``
  steps. Each chunk starts from the state at its start (the previous chunk's converged end
  state; ``h0`` for the first chunk), runs Newton on-chip until its max residual is ``<= tol``
  or ``MAX_ITERS`` updates ran, and hands its end state on. The pre-activations are read once
  and the states written once. With several segments, each segment after the first starts from
  the initial guess one step before it and then corrects itself from the previous one's final
  end state, on the device (the section "time segments chained on the device" below).
* ``gru_backward_kernel`` -- grid ``(cdiv(D, BLOCK_D), B)``: one reverse pass over time per
  program: the adjoint ``μ_t = g_t + J_{t+1} μ_{t+1}`` chunk by chunk (an associative scan per
  chunk plus the carry), ``∂L/∂u``, ``∂L/∂h0 = J_0 μ_0`` and the per-program partial sums of the
  weight gradient (summed by the launcher in a fixed order: no atomics, bit-reproducible).
* ``gru_sequential_kernel`` -- grid ``(cdiv(D, BLOCK_D), B)``: the recurrence step by step, the
  baseline and the inference path.

The small helpers after the GRU kernels (residual size, row pick, one-row shift) are shared with
the block-cell kernels (``_kernels_lstm``, ``_kernels_slstm``).
"""

import triton
import triton.language as tl

from ..dispatch import triton_interpret_mode

#: Whether σ, exp and log use the GPU's approximate instructions with denormals flushed to zero
#: (``ex2.approx.ftz``, ``rcp.approx.ftz``, ``lg2.approx.ftz``, one instruction each). Triton's
#: own lowering uses the same approximations (``ex2.approx``, ``div.full``, ``lg2.approx``) and
#: wraps each in range fix-ups for denormal arguments and results, which these kernels never
#: need: σ divides by ``1 + e^{-x} >= 1``, an exp below ``2^-126`` is 0 to any tolerance here,
#: and every log argument is ``>= 1``. In an sm_90 compile σ takes 4 instructions instead of 11.
#: The interpreter cannot run PTX: under ``TRITON_INTERPRET=1`` the kernels keep Triton's own.
_FAST_MATH = tl.constexpr(not triton_interpret_mode())


@triton.jit
def _approx(asm: tl.constexpr, x):
    return tl.inline_asm_elementwise(asm, "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def _exp(x):
    if _FAST_MATH:
        return _approx("ex2.approx.ftz.f32 $0, $1;", x * 1.4426950408889634)
    else:
        return tl.exp(x)


@triton.jit
def _log(x):
    if _FAST_MATH:
        return _approx("lg2.approx.ftz.f32 $0, $1;", x) * 0.6931471805599453
    else:
        return tl.log(x)


@triton.jit
def _sigmoid(x):
    if _FAST_MATH:
        return _approx("rcp.approx.ftz.f32 $0, $1;", 1.0 + _exp(-x))
    else:
        return tl.sigmoid(x)


@triton.jit
def _tanh(x):
    # tanh(x) = 2σ(2x) - 1: one transcendental, and the interpreter runs it too.
    return 2.0 * _sigmoid(2.0 * x) - 1.0


@triton.jit
def _combine(a_left, b_left, a_right, b_right):
    # The pair monoid of y_t = a_t y_{t-1} + b_t; `left` is earlier in processing order.
    return a_right * a_left, a_right * b_left + b_right


@triton.jit
def _multiply(a, b):
    return a * b


@triton.jit
def _gru_gates(h, u_z, u_r, u_c, a_z, a_r, a_c):
    z = _sigmoid(u_z + a_z * h)
    r = _sigmoid(u_r + a_r * h)
    c = _tanh(u_c + a_c * r * h)
    return z, r, c


@triton.jit
def _gru_step_and_jacobian(h, u_z, u_r, u_c, a_z, a_r, a_c):
    z, r, c = _gru_gates(h, u_z, u_r, u_c, a_z, a_r, a_c)
    gap = c - h
    d_c = z * (1.0 - c * c)
    jac = (1.0 - z) + z * (1.0 - z) * a_z * gap + d_c * a_c * (r + r * (1.0 - r) * a_r * h)
    return h + z * gap, jac


@triton.jit
def _load_gates(u_ptr, offs_u, mask, D):
    u_z = tl.load(u_ptr + offs_u, mask=mask, other=0.0).to(tl.float32)
    u_r = tl.load(u_ptr + offs_u + D, mask=mask, other=0.0).to(tl.float32)
    u_c = tl.load(u_ptr + offs_u + 2 * D, mask=mask, other=0.0).to(tl.float32)
    return u_z, u_r, u_c


@triton.jit
def _load_weights(w_ptr, offs_d, mask_d, D):
    a_z = tl.load(w_ptr + offs_d, mask=mask_d, other=0.0).to(tl.float32)
    a_r = tl.load(w_ptr + D + offs_d, mask=mask_d, other=0.0).to(tl.float32)
    a_c = tl.load(w_ptr + 2 * D + offs_d, mask=mask_d, other=0.0).to(tl.float32)
    return a_z, a_r, a_c


@triton.jit
def _load_chunk(u_ptr, row_base, c0, t_end, D, offs_d, mask_d, BLOCK_T: tl.constexpr):
    t = c0 + tl.arange(0, BLOCK_T)
    mask = (t < t_end)[:, None] & mask_d[None, :]
    offs_u = (row_base + t)[:, None] * (3 * D) + offs_d[None, :]
    return _load_gates(u_ptr, offs_u, mask, D)


@triton.jit
def _gru_guess(u_z, u_c, GUESS: tl.constexpr):
    """The one-row initial guess: ``f(0, u_t)`` (``GUESS`` 1 or 2) or zeros (``GUESS=0``)."""
    if GUESS >= 1:
        return _sigmoid(u_z) * _tanh(u_c)
    else:
        return tl.zeros_like(u_z)


@triton.jit
def _first_row_carry(a, b, rows, carry):
    """Fold the state before a chunk into its first row: ``b_0 + a_0 · carry``."""
    return tl.where((rows == 0)[:, None], b + a * carry[None, :], b)


@triton.jit
def _gru_uncoupled(u_z, u_c, h, rows):
    """A chunk's states with the recurrent weights dropped (``GUESS=2``), solved from the exact
    state ``h`` before it: ``h_t = (1 - σ(u_z)) h_{t-1} + σ(u_z) tanh(u_c)``, one scan."""
    z = _sigmoid(u_z)
    keep = 1.0 - z
    _prod, states = tl.associative_scan(
        (keep, _first_row_carry(keep, z * _tanh(u_c), rows, h)), 0, _combine
    )
    return states


@triton.jit
def _gru_chunk(
    states, h, u_z, u_r, u_c, a_z, a_r, a_c, mask, valid, rows, before, hist, slots, tol, omega,
    MAX_ITERS: tl.constexpr, HIST: tl.constexpr,
):  # fmt: skip
    """Newton on one chunk from the guess ``states`` and the exact state ``h`` before it:
    ``(states, hist, updates)``, updates until the max residual is ``<= tol`` or ``MAX_ITERS``."""
    k = 0
    done = 0
    while done == 0:
        prev = _shift_rows(states, before, rows, h)
        f_val, jac = _gru_step_and_jacobian(prev, u_z, u_r, u_c, a_z, a_r, a_c)
        residual = tl.where(mask, f_val - states, 0.0)
        worst = _tile_max(_residual_size(residual))
        hist = tl.where(slots == k, tl.maximum(hist, worst), hist)
        if tl.where(worst <= tol, 1, 0) + tl.where(k >= MAX_ITERS, 1, 0) > 0:
            done = 1
            # The last slot keeps the largest residual any chunk stopped at.
            hist = tl.where(slots == HIST - 1, tl.maximum(hist, worst), hist)
        else:
            mult = tl.where(valid[:, None], jac, 1.0)
            _prod, delta = tl.associative_scan((mult, residual), 0, _combine)
            states = states + omega * delta
            k += 1
    return states, hist, k


@triton.jit
def gru_newton_kernel(
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
    """``h0 [B, D]`` (``start``) -> states ``out [B, T, D]``.

    ``GUESS``: 0 zeros, 1 ``f(0, u_t)``, 2 each chunk's states with the recurrent weights
    dropped, solved from its exact start state (``_gru_uncoupled``; a later segment's start
    guess is ``f(0, u)`` then). ``CHAINED`` (more than one segment): programs take
    their ``(channel block, row, segment)`` by ticket (``sync [1 + S·B·n_d]`` int32 zeros: the
    ticket, then a flag per program), start a later segment from the guess one step before it,
    record each chunk's start state in float32 in ``chunk [B, n_chunks, D]``, correct their
    segment from the previous one's final end state and publish their own in ``end [S, B, D]``
    (section "time segments chained on the device"). ``stats [HIST + 1]``
    (zeroed by the launcher) receives maxima over all programs (``_publish_stats``): entry k the
    max residual of the chunks before update k (+inf for a non-finite residual), entry
    ``HIST - 1`` the largest residual a chunk stopped at (and the largest start mismatch a
    correcting walk stopped at), entry ``HIST`` the most updates any chunk ran.
    """
    pid_d, pid_b, seg = _segment_program(sync_ptr, CHAINED)
    n_b = tl.num_programs(1)
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    rows = tl.arange(0, BLOCK_T)
    a_z, a_r, a_c = _load_weights(w_ptr, offs_d, mask_d, D)

    seg_slot = (seg.to(tl.int64) * n_b + pid_b) * D + offs_d
    h = tl.load(start_ptr + pid_b.to(tl.int64) * D + offs_d, mask=mask_d, other=0.0)
    h = h.to(tl.float32)
    hist = tl.full([HIST], -1.0, dtype=tl.float32)
    slots = tl.arange(0, HIST)
    most_iters = tl.full([], 0, dtype=tl.int32)
    # Shift by one step inside a chunk: row i reads row i - 1 (row 0 reads the carry below).
    before = tl.maximum(rows - 1, 0)[:, None] + tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.int32)

    t_begin = seg * seg_len
    t_end = tl.minimum(t_begin + seg_len, T)
    row_base = pid_b.to(tl.int64) * T
    chunk_base = pid_b.to(tl.int64) * tl.cdiv(T, BLOCK_T)
    if CHAINED:
        # A later segment starts from the initial guess one step before it.
        before_row = (row_base + tl.maximum(t_begin - 1, 0)) * (3 * D) + offs_d
        g_z, _g_r, g_c = _load_gates(u_ptr, before_row, mask_d, D)
        h = tl.where(seg > 0, _gru_guess(g_z, g_c, GUESS), h)
    # The next chunk's inputs are in flight while this chunk iterates.
    n_z, n_r, n_c = _load_chunk(u_ptr, row_base, t_begin, t_end, D, offs_d, mask_d, BLOCK_T)
    for c0 in range(t_begin, t_end, BLOCK_T):
        u_z, u_r, u_c = n_z, n_r, n_c
        n_z, n_r, n_c = _load_chunk(
            u_ptr, row_base, c0 + BLOCK_T, t_end, D, offs_d, mask_d, BLOCK_T
        )
        t = c0 + rows
        valid = t < t_end
        mask = valid[:, None] & mask_d[None, :]
        offs_out = (row_base + t)[:, None] * D + offs_d[None, :]
        if GUESS == 2:
            states = _gru_uncoupled(u_z, u_c, h, rows)
        else:
            states = _gru_guess(u_z, u_c, GUESS)
        if CHAINED:
            tl.store(chunk_ptr + (chunk_base + c0 // BLOCK_T) * D + offs_d, h, mask=mask_d)
        states, hist, k = _gru_chunk(
            states, h, u_z, u_r, u_c, a_z, a_r, a_c, mask, valid, rows, before, hist, slots,
            tol, omega, MAX_ITERS, HIST,
        )  # fmt: skip
        most_iters = tl.maximum(most_iters, k)
        tl.store(out_ptr + offs_out, states.to(out_ptr.dtype.element_ty), mask=mask)
        h = _pick_row(states, rows, tl.minimum(c0 + BLOCK_T, t_end) - 1 - c0)

    if CHAINED:
        if seg > 0:
            # Correct the segment from the previous one's final end state, chunk by chunk,
            # until a chunk's start state is within tol of the one its states were solved from
            # (the correction has died out: the rest stands).
            tl.debug_barrier()  # this program's states, stored by any of its threads
            _wait_for_segment_before(sync_ptr, pid_d, pid_b, seg)
            h_in = tl.load(end_ptr + seg_slot - n_b * D, mask=mask_d, other=0.0, volatile=True)
            c0 = t_begin
            slot = (chunk_base + c0 // BLOCK_T) * D + offs_d
            gap = _start_mismatch(chunk_ptr + slot, h_in, mask_d, c0 < t_end)
            while gap > tol:
                u_z, u_r, u_c = _load_chunk(u_ptr, row_base, c0, t_end, D, offs_d, mask_d, BLOCK_T)
                t = c0 + rows
                valid = t < t_end
                mask = valid[:, None] & mask_d[None, :]
                offs_out = (row_base + t)[:, None] * D + offs_d[None, :]
                states = tl.load(out_ptr + offs_out, mask=mask, other=0.0).to(tl.float32)
                states, hist, k = _gru_chunk(
                    states, h_in, u_z, u_r, u_c, a_z, a_r, a_c, mask, valid, rows, before,
                    hist, slots, tol, omega, MAX_ITERS, HIST,
                )  # fmt: skip
                most_iters = tl.maximum(most_iters, k)
                tl.store(out_ptr + offs_out, states.to(out_ptr.dtype.element_ty), mask=mask)
                h_in = _pick_row(states, rows, tl.minimum(c0 + BLOCK_T, t_end) - 1 - c0)
                c0 += BLOCK_T
                slot = (chunk_base + c0 // BLOCK_T) * D + offs_d
                gap = _start_mismatch(chunk_ptr + slot, h_in, mask_d, c0 < t_end)
            hist = tl.where(slots == HIST - 1, tl.maximum(hist, gap), hist)
            # Walked to the end: the segment's end state moved with it.
            h = tl.where(c0 >= t_end, h_in, h)
        tl.store(end_ptr + seg_slot, h, mask=mask_d)
        _publish_segment(sync_ptr, pid_d, pid_b, seg)
    _publish_stats(stats_ptr, hist, slots, most_iters, HIST)


@triton.jit
def _load_backward_chunk(
    u_ptr, grad_ptr, states_ptr, h0, row_base, top, D, offs_d, mask_d, BLOCK_T: tl.constexpr
):
    """Rows ``i`` = steps ``top - i``: the gates, ``∂L/∂h`` and the consumed state (h0 at 0)."""
    t = top - tl.arange(0, BLOCK_T)
    mask = (t >= 0)[:, None] & mask_d[None, :]
    offs = (row_base + t)[:, None] * D + offs_d[None, :]
    offs_u = (row_base + t)[:, None] * (3 * D) + offs_d[None, :]
    u_z, u_r, u_c = _load_gates(u_ptr, offs_u, mask, D)
    g = tl.load(grad_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    prev = tl.load(states_ptr + offs - D, mask=mask & (t >= 1)[:, None], other=0.0)
    prev = tl.where((t == 0)[:, None], h0[None, :], prev.to(tl.float32))
    return u_z, u_r, u_c, g, prev


@triton.jit
def gru_backward_kernel(
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
    """Reverse pass; ``grad_w [3, B, cdiv(D, BLOCK_D)·BLOCK_D]`` gets this program's partials.

    Rows of a chunk run backwards in time (row i is step ``top - i``), so a forward associative
    scan over rows solves the reverse recurrence.
    """
    pid_d = tl.program_id(0)
    pid_b = tl.program_id(1)
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    rows = tl.arange(0, BLOCK_T)
    a_z, a_r, a_c = _load_weights(w_ptr, offs_d, mask_d, D)
    h0 = tl.load(h0_ptr + pid_b.to(tl.int64) * D + offs_d, mask=mask_d, other=0.0)
    h0 = h0.to(tl.float32)
    # Row i's multiplier is J at step top - i + 1: the row before it (row 0: the carried one).
    before = tl.maximum(rows - 1, 0)[:, None] + tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.int32)

    mu_next = tl.zeros([BLOCK_D], dtype=tl.float32)
    jac_next = tl.zeros([BLOCK_D], dtype=tl.float32)
    # Weight-gradient partials per (row, channel), reduced over rows once at the end.
    acc_z = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
    acc_r = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
    acc_c = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
    row_base = pid_b.to(tl.int64) * T
    # The loads do not depend on the carried adjoint: the next chunk's are in flight while
    # this one is scanned.
    n_z, n_r, n_c, n_g, n_prev = _load_backward_chunk(
        u_ptr, grad_ptr, states_ptr, h0, row_base, T - 1, D, offs_d, mask_d, BLOCK_T
    )
    for c0 in range(0, T, BLOCK_T):
        u_z, u_r, u_c, g, prev = n_z, n_r, n_c, n_g, n_prev
        n_z, n_r, n_c, n_g, n_prev = _load_backward_chunk(
            u_ptr,
            grad_ptr,
            states_ptr,
            h0,
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

        z, r, c = _gru_gates(prev, u_z, u_r, u_c, a_z, a_r, a_c)
        d_z = z * (1.0 - z) * (c - prev)
        d_c = z * (1.0 - c * c)
        d_r = d_c * a_c * prev * r * (1.0 - r)
        jac = (1.0 - z) + d_z * a_z + d_c * a_c * r + d_r * a_r
        jac = tl.where(mask, jac, 0.0)

        mult = tl.gather(jac, before, 0)
        mult = tl.where((rows == 0)[:, None], jac_next[None, :], mult)
        prod, acc = tl.associative_scan((mult, g), 0, _combine)
        mu = acc + prod * mu_next[None, :]
        mu = tl.where(mask, mu, 0.0)

        tl.store(grad_u_ptr + offs_u, (mu * d_z).to(grad_u_ptr.dtype.element_ty), mask=mask)
        tl.store(grad_u_ptr + offs_u + D, (mu * d_r).to(grad_u_ptr.dtype.element_ty), mask=mask)
        tl.store(grad_u_ptr + offs_u + 2 * D, (mu * d_c).to(grad_u_ptr.dtype.element_ty), mask=mask)
        acc_z += mu * d_z * prev
        acc_r += mu * d_r * prev
        acc_c += mu * d_c * r * prev

        if T - 1 - c0 < BLOCK_T:  # the chunk holding step 0: ∂L/∂h0 = J_0 μ_0
            grad_h0 = tl.sum(tl.where((t == 0)[:, None], jac * mu, 0.0), axis=0)
            tl.store(
                grad_h0_ptr + pid_b.to(tl.int64) * D + offs_d,
                grad_h0.to(grad_h0_ptr.dtype.element_ty),
                mask=mask_d,
            )
        mu_next = tl.sum(tl.where((rows == BLOCK_T - 1)[:, None], mu, 0.0), axis=0)
        jac_next = tl.sum(tl.where((rows == BLOCK_T - 1)[:, None], jac, 0.0), axis=0)

    slot, row_stride = _partial_slots(BLOCK_D)
    tl.store(grad_w_ptr + slot, tl.sum(acc_z, axis=0))
    tl.store(grad_w_ptr + slot + row_stride, tl.sum(acc_r, axis=0))
    tl.store(grad_w_ptr + slot + 2 * row_stride, tl.sum(acc_c, axis=0))


@triton.jit
def gru_sequential_kernel(
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
    """``h_t = f(h_{t-1}, u_t)`` one step at a time, ``ROWS`` steps per load: the next group's
    inputs are in flight while this group's steps run, and each group's states are stored as
    one tile (enough bytes in flight to reach bandwidth when ``B·D`` is large).

    ``VEC`` caps the channels a thread loads as one vector: when ``BLOCK_D`` is ``VEC`` times
    the program's threads, every thread holds all ``ROWS`` steps of its channels, so picking a
    step out of the tile (and putting the new state into the output tile) folds to register
    moves instead of reductions across threads.
    """
    pid_d = tl.program_id(0)
    pid_b = tl.program_id(1)
    offs_d = tl.max_contiguous(pid_d * BLOCK_D + tl.arange(0, BLOCK_D), VEC)
    mask_d = offs_d < D
    rows = tl.arange(0, ROWS)
    a_z, a_r, a_c = _load_weights(w_ptr, offs_d, mask_d, D)
    h = tl.load(h0_ptr + pid_b.to(tl.int64) * D + offs_d, mask=mask_d, other=0.0)
    h = h.to(tl.float32)
    row_base = pid_b.to(tl.int64) * T
    n_z, n_r, n_c = _load_chunk(u_ptr, row_base, 0, T, D, offs_d, mask_d, ROWS)
    for c0 in range(0, T, ROWS):
        g_z, g_r, g_c = n_z, n_r, n_c
        n_z, n_r, n_c = _load_chunk(u_ptr, row_base, c0 + ROWS, T, D, offs_d, mask_d, ROWS)
        block = tl.zeros([ROWS, BLOCK_D], dtype=tl.float32)
        for r in tl.static_range(ROWS):
            u_z = _pick_row(g_z, rows, r)
            u_r = _pick_row(g_r, rows, r)
            u_c = _pick_row(g_c, rows, r)
            z, _r, c = _gru_gates(h, u_z, u_r, u_c, a_z, a_r, a_c)
            h = h + z * (c - h)
            block = tl.where((rows == r)[:, None], h[None, :], block)
        t = c0 + rows
        mask = (t < T)[:, None] & mask_d[None, :]
        offs = (row_base + t)[:, None] * D + offs_d[None, :]
        tl.store(out_ptr + offs, block.to(out_ptr.dtype.element_ty), mask=mask)


# -- helpers shared with the block-cell kernels -------------------------------------------------


@triton.jit
def _residual_size(residual):
    # NaN counts as +inf (tl.max would drop it): never converged, reported non-finite.
    return tl.where(residual == residual, tl.abs(residual), float("inf"))


@triton.jit
def _tile_max(x):
    # Over rows first: a tile's rows of one channel live in one warp (lanes and registers),
    # its channels across warps, so a single exchange between warps is left (fewer barriers
    # per Newton iteration in an sm_90 compile; the max is the same either way).
    return tl.max(tl.max(x, axis=0), axis=0)


@triton.jit
def _pick_row(x, rows, i):
    """Row ``i`` of a ``[BLOCK_T, BLOCK_D]`` tile as ``[BLOCK_D]`` (other rows may hold NaN).

    The other rows count as -0.0, the exact identity of float addition (``x + -0.0 == x`` for
    every x, where ``+0.0`` would turn a -0.0 into +0.0): with ``i`` known at compile time and
    the rows held in one thread, the compiler folds the whole sum to a register move.
    """
    return tl.sum(tl.where((rows == i)[:, None], x, -0.0), axis=0)


@triton.jit
def _shift_rows(x, before, rows, carry):
    """Row ``i`` gets row ``i - 1`` of ``x``; row 0 gets ``carry [BLOCK_D]``."""
    shifted = tl.gather(x, before, 0)
    return tl.where((rows == 0)[:, None], carry[None, :], shifted)


@triton.jit
def _publish_stats(stats_ptr, hist, slots, most_iters, HIST: tl.constexpr):
    # Every stat is a max over programs (and passes): atomic maxima into one buffer, so no
    # reduction kernel runs after the solve. Entries no chunk reached stay at the buffer's
    # zero (this program's -1 loses), and the launcher reads only those up to the most updates.
    tl.atomic_max(stats_ptr + slots, hist)
    tl.atomic_max(stats_ptr + HIST, most_iters.to(tl.float32))


@triton.jit
def _partial_slots(BLOCK_D: tl.constexpr):
    """Where a backward program puts its weight-gradient partials in ``grad_w [R, B,
    cdiv(D, BLOCK_D)·BLOCK_D]``: row r at ``slot + r · row_stride``. Laid out so that the
    launcher's sum over B reads them in place (no reordering copy first)."""
    n_d = tl.num_programs(0)
    program = tl.program_id(1).to(tl.int64) * n_d + tl.program_id(0)
    row_stride = tl.num_programs(1).to(tl.int64) * n_d * BLOCK_D
    return program * BLOCK_D + tl.arange(0, BLOCK_D), row_stride


@triton.jit
def _record_residual(hist, slots, k, worst, tol, MAX_ITERS: tl.constexpr, HIST: tl.constexpr):
    """Note a chunk's residual before update ``k``; 1 when the chunk stops here, else 0.

    Entry ``k`` of ``hist`` keeps the max over chunks before update k, the last entry the largest
    residual a chunk stopped at (see ``gru_newton_kernel``).
    """
    hist = tl.where(slots == k, tl.maximum(hist, worst), hist)
    stop = tl.where(worst <= tol, 1, 0) + tl.where(k >= MAX_ITERS, 1, 0)
    # -1 (below every residual) leaves the last entry as it is when the chunk goes on.
    stopped_at = tl.where(stop > 0, worst, -1.0)
    hist = tl.where(slots == HIST - 1, tl.maximum(hist, stopped_at), hist)
    return hist, tl.where(stop > 0, 1, 0)


# -- time segments chained on the device -------------------------------------------------------
# With CHAINED, segment s > 0 first runs from a guessed start state, then waits for segment
# s - 1's final end state and walks its chunks again from it, each warm-started from its states,
# until a chunk's start state is within tol of the one recorded when its states were solved: the
# start's error has died out along the way (contraction), and every chunk after it stands. A
# segment publishes its end state (stores, barrier, release) only when it is final, and its
# successor reads it after an acquire, with volatile loads. Programs are handed out by an atomic
# ticket, segments slowest, so a program waits only on programs that already run: no deadlock
# whatever order the hardware starts programs in.


@triton.jit
def _segment_program(sync_ptr, CHAINED: tl.constexpr):
    """``(channel block, batch row, segment)`` of this program: its grid position, or with
    ``CHAINED`` its place in ticket order (``sync[0]`` counts the tickets)."""
    if CHAINED:
        ticket = tl.atomic_add(sync_ptr, 1)
        n_d = tl.num_programs(0)
        n_cols = n_d * tl.num_programs(1)
        col = ticket % n_cols
        return col % n_d, col // n_d, ticket // n_cols
    else:
        return tl.program_id(0), tl.program_id(1), tl.program_id(2)


@triton.jit
def _segment_flag(sync_ptr, pid_d, pid_b, seg):
    """Where program ``(pid_d, pid_b, seg)`` flags its end state final (``sync[1 + ticket]``)."""
    n_d = tl.num_programs(0)
    return sync_ptr + 1 + (seg * tl.num_programs(1) + pid_b) * n_d + pid_d


@triton.jit
def _wait_for_segment_before(sync_ptr, pid_d, pid_b, seg):
    """Spin until segment ``seg - 1`` of the same channels has published its final end state
    (one scalar atomic per poll, the same on every thread)."""
    flag = _segment_flag(sync_ptr, pid_d, pid_b, seg - 1)
    ready = tl.atomic_add(flag, 0, sem="acquire")
    while ready == 0:
        ready = tl.atomic_add(flag, 0, sem="acquire")


@triton.jit
def _publish_segment(sync_ptr, pid_d, pid_b, seg):
    """Flag this program's end state (stored before the call) final."""
    tl.debug_barrier()
    tl.atomic_xchg(_segment_flag(sync_ptr, pid_d, pid_b, seg), 1, sem="release")


@triton.jit
def _start_mismatch(recorded_ptr, state, mask_d, live):
    """``max |state - recorded|`` over the tile's channels (one state component; NaN counts as
    +inf) for a chunk that exists (``live``), -1 for one past the segment's end."""
    # live as a vector comparison: the interpreter takes no scalar-and-vector mask.
    on = tl.where(mask_d, 1, 0) * tl.where(live, 1, 0) > 0
    recorded = tl.load(recorded_ptr, mask=on, other=0.0)
    mismatch = tl.max(tl.where(mask_d, _residual_size(state - recorded), 0.0), axis=0)
    return tl.where(live, mismatch, -1.0)
