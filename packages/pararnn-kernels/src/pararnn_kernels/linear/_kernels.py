"""Triton kernel of the float32 GEMM on tensor cores (kernel-only module: no types, no public API).

``C[s] = A[:, K_s] @ B[K_s, :]`` for the ``s``-th slice ``K_s`` of the reduction (split-K; one
slice unless asked), each product taken by ``tl.dot`` with ``PRECISION`` (``"tf32x3"``: every
float32 operand split into a TF32 head and a TF32 tail, three tensor-core products, the tail
times tail one dropped; ``"ieee"``: plain float32 FMAs), accumulated in float32. Operands are
addressed by strides; tiles contiguous along the reduction (``stride_ak == stride_bk == 1``)
are the fast ones for those. Optionally the bias is added to every row (one slice only).

``PRECISION="bf16x6"`` splits each float32 tile in the kernel into three bfloat16 parts
(8 significant bits each, 24 in all) and takes the six products whose parts' weights are at
least 2^-16 of the head's (``a0 b0``; ``a0 b1``, ``a1 b0``; ``a0 b2``, ``a1 b1``, ``a2 b0``) on
the bfloat16 tensor cores. The six are summed into a fresh accumulator per step of the
reduction, which is then added to the running one in float32: added to the running total
directly, the small products lost their low bits against it (an H100 gave 1.1e-5 relative
error at K = 32768 that way, 1.7e-7 this way). The 16-bit tensor-core products read tiles of
either orientation, which the 32-bit ones do not: it serves reductions along the operands'
rows, the weight gradient ``(∂L/∂y)ᵀ x``.
"""

import triton
import triton.language as tl

from ..dispatch import triton_interpret_mode

#: The Triton interpreter multiplies bfloat16 tiles wrongly (Triton 3.9: their bits as
#: integers); under ``TRITON_INTERPRET=1`` the bf16x6 parts are multiplied in float32 instead.
_BF16_DOTS = tl.constexpr(not triton_interpret_mode())


@triton.jit
def matmul_kernel(
    a,
    b,
    c,
    bias,
    M,
    N,
    K,
    k_per_split,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cs,
    stride_cm,
    stride_cn,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    PRECISION: tl.constexpr,
    STAGES: tl.constexpr,
):
    pid = tl.program_id(0)
    split = tl.program_id(1)
    # Programs walk GROUP_M row blocks down one column block before the next column block, so
    # the B tiles in flight stay in L2.
    blocks_m = tl.cdiv(M, BLOCK_M)
    blocks_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * blocks_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(blocks_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows
    m0 = pid_m * BLOCK_M
    n0 = pid_n * BLOCK_N
    local_rows = tl.arange(0, BLOCK_M)
    local_cols = tl.arange(0, BLOCK_N)
    steps = tl.arange(0, BLOCK_K)
    row_ok = m0 + local_rows < M
    col_ok = n0 + local_cols < N
    k_start = split * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    # A tile's corner is addressed in 64 bits (an operand may hold 2^31 elements or more) and
    # advances one block of the reduction per step; offsets inside a tile stay 32-bit.
    a_corner = a + m0.to(tl.int64) * stride_am + k_start.to(tl.int64) * stride_ak
    b_corner = b + k_start.to(tl.int64) * stride_bk + n0.to(tl.int64) * stride_bn
    a_offsets = local_rows[:, None] * stride_am + steps[None, :] * stride_ak
    b_offsets = steps[:, None] * stride_bk + local_cols[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in tl.range(k_start, k_end, BLOCK_K, num_stages=STAGES):
        k_ok = k + steps < k_end
        a_tile = tl.load(a_corner + a_offsets, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b_tile = tl.load(b_corner + b_offsets, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        if PRECISION == "bf16x6":
            acc = _dot_bf16x6(a_tile, b_tile, acc)
        else:
            acc = tl.dot(a_tile, b_tile, acc, input_precision=PRECISION)
        a_corner += BLOCK_K * stride_ak
        b_corner += BLOCK_K * stride_bk
    if HAS_BIAS:
        # The first slice of a split reduction carries the bias; the others add zeros.
        bias_row = tl.load(bias + n0 + local_cols, mask=col_ok, other=0.0)
        acc += tl.where(split == 0, bias_row, 0.0)[None, :]
    c_corner = c + split.to(tl.int64) * stride_cs + m0.to(tl.int64) * stride_cm + n0 * stride_cn
    tl.store(
        c_corner + local_rows[:, None] * stride_cm + local_cols[None, :] * stride_cn,
        acc,
        mask=row_ok[:, None] & col_ok[None, :],
    )


@triton.jit
def _split_bf16x3(x):
    # Round to nearest at each step: every remainder is exact in float32, and the three parts
    # carry about 24 significant bits of x.
    head = x.to(tl.bfloat16)
    rest = x - head.to(tl.float32)
    middle = rest.to(tl.bfloat16)
    tail = (rest - middle.to(tl.float32)).to(tl.bfloat16)
    return head, middle, tail


@triton.jit
def _dot_bf16x6(a, b, acc):
    a0, a1, a2 = _split_bf16x3(a)
    b0, b1, b2 = _split_bf16x3(b)
    # The smallest products first, into this step's own sum (module docstring); a1 b2, a2 b1
    # and a2 b2 (2^-24 of the head's weight and below) are dropped.
    if _BF16_DOTS:
        step = tl.dot(a2, b0, out_dtype=tl.float32)
        step = tl.dot(a1, b1, step, out_dtype=tl.float32)
        step = tl.dot(a0, b2, step, out_dtype=tl.float32)
        step = tl.dot(a1, b0, step, out_dtype=tl.float32)
        step = tl.dot(a0, b1, step, out_dtype=tl.float32)
        step = tl.dot(a0, b0, step, out_dtype=tl.float32)
    else:
        # The interpreter: the same parts, exact in float32, multiplied in float32.
        a0, a1, a2 = a0.to(tl.float32), a1.to(tl.float32), a2.to(tl.float32)
        b0, b1, b2 = b0.to(tl.float32), b1.to(tl.float32), b2.to(tl.float32)
        step = tl.dot(a2, b0, input_precision="ieee")
        step = tl.dot(a1, b1, step, input_precision="ieee")
        step = tl.dot(a0, b2, step, input_precision="ieee")
        step = tl.dot(a1, b0, step, input_precision="ieee")
        step = tl.dot(a0, b1, step, input_precision="ieee")
        step = tl.dot(a0, b0, step, input_precision="ieee")
    return acc + step
