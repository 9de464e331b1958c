"""The exact product on CUDA: one Triton tile configuration for every shape, no split-K.

Each program computes one ``BLOCK_M x BLOCK_N`` tile of the output, looping over ``K`` in
``BLOCK_K`` steps in order with an fp32 accumulator; every row of every tile runs the same
instructions, whatever ``M``, so a row's result depends only on that row and the weights
(cuBLAS picks its kernel, its split-K and its reduction order from ``M``). Rounded to the
inputs' dtype once, at the end. Runs on CPU tensors under ``TRITON_INTERPRET=1`` (tests).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# The one configuration (bf16 on an H200: bench/exact_kernels.py measures it against cuBLAS).
BLOCK_M, BLOCK_N, BLOCK_K = 64, 128, 64
GROUP_M = 8  # tiles visited in groups of 8 row blocks, so a weight tile stays in L2
NUM_WARPS, NUM_STAGES = 4, 4


@triton.jit
def _mm_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
               stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, IEEE: tl.constexpr):
    pid = tl.program_id(0)
    blocks_m = tl.cdiv(M, BLOCK_M)
    blocks_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * blocks_n
    first_m = (pid // per_group) * GROUP_M
    group_size = tl.minimum(blocks_m - first_m, GROUP_M)
    block_m = first_m + (pid % per_group) % group_size
    block_n = (pid % per_group) // group_size
    rows = block_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = block_n * BLOCK_N + tl.arange(0, BLOCK_N)
    inner = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        ks = k + inner
        a = tl.load(a_ptr + rows[:, None] * stride_am + ks[None, :] * stride_ak,
                    mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)
        b = tl.load(b_ptr + ks[:, None] * stride_bk + cols[None, :] * stride_bn,
                    mask=(ks[:, None] < K) & (cols[None, :] < N), other=0.0)
        if IEEE:
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
    tl.store(c_ptr + rows[:, None] * stride_cm + cols[None, :] * stride_cn,
             acc.to(c_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))


def invariant_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a (M, K) @ b (K, N)`` in ``a``'s dtype (fp32 inputs multiply in IEEE fp32, not TF32),
    every row computed by the same tile program whatever ``M``."""
    if a.dtype != b.dtype:
        raise TypeError(f"exact matmul of {a.dtype} by {b.dtype}: cast one first")
    rows, inner = a.shape
    out = torch.empty((rows, b.shape[1]), dtype=a.dtype, device=a.device)
    if rows == 0 or out.shape[1] == 0:
        return out
    if inner == 0:
        return out.zero_()
    grid = (triton.cdiv(rows, BLOCK_M) * triton.cdiv(b.shape[1], BLOCK_N),)
    _mm_kernel[grid](a, b, out, rows, b.shape[1], inner, a.stride(0), a.stride(1), b.stride(0),
                     b.stride(1), out.stride(0), out.stride(1), BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
                     BLOCK_K=BLOCK_K, GROUP_M=GROUP_M, IEEE=a.dtype == torch.float32,
                     num_warps=NUM_WARPS, num_stages=NUM_STAGES)
    return out
