"""Triton kernel of the float32 GEMM on tensor cores (kernel-only module: no types, no public API).

``C[s] = A[:, K_s] @ B[K_s, :]`` for the ``s``-th slice ``K_s`` of the reduction (split-K; one
slice unless asked), each product taken by ``tl.dot`` with ``PRECISION`` (``"tf32x3"``: every
float32 operand split into a TF32 head and a TF32 tail, three tensor-core products, the tail
times tail one dropped; ``"ieee"``: plain float32 FMAs), accumulated in float32. Operands are
addressed by strides, so transposed views need no copy. Optionally the bias is added to every
row (one slice only), and the rows of ``A`` are summed over each slice (``ROW_SUM``: the bias
gradient of a linear layer rides along its weight gradient, ``∂L/∂b = Σ_rows ∂L/∂y``).
"""

import triton
import triton.language as tl


@triton.jit
def matmul_kernel(
    a,
    b,
    c,
    bias,
    row_sum,
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
    ROW_SUM: tl.constexpr,
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
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < M
    col_ok = cols < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    sums = tl.zeros((BLOCK_M,), dtype=tl.float32)
    k_start = split * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    for k in tl.range(k_start, k_end, BLOCK_K, num_stages=STAGES):
        ks = k + tl.arange(0, BLOCK_K)
        k_ok = ks < k_end
        a_tile = tl.load(
            a + rows[:, None] * stride_am + ks[None, :] * stride_ak,
            mask=row_ok[:, None] & k_ok[None, :],
            other=0.0,
        )
        b_tile = tl.load(
            b + ks[:, None] * stride_bk + cols[None, :] * stride_bn,
            mask=k_ok[:, None] & col_ok[None, :],
            other=0.0,
        )
        acc = tl.dot(a_tile, b_tile, acc, input_precision=PRECISION)
        if ROW_SUM:
            sums += tl.sum(a_tile, axis=1)
    if HAS_BIAS:
        acc += tl.load(bias + cols, mask=col_ok, other=0.0)[None, :]
    tl.store(
        c + split * stride_cs + rows[:, None] * stride_cm + cols[None, :] * stride_cn,
        acc,
        mask=row_ok[:, None] & col_ok[None, :],
    )
    if ROW_SUM:  # noqa: SIM102 (a compile-time branch around a run-time one)
        # Every column block sums the same rows; the first one writes them.
        if pid_n == 0:
            tl.store(row_sum + split * M + rows, sums, mask=row_ok)
