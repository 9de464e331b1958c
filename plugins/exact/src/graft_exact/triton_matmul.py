"""The exact product on CUDA: one Triton tile configuration for every shape, ``K`` summed in
fixed chunks.

Each ``BLOCK_M x BLOCK_N`` tile of the output sums ``K`` in chunks of `CHUNK_K`: a chunk's
products accumulate from zero in fp32 (``BLOCK_K`` at a time, in order), and the chunk totals
are added in order. Every row of every tile runs the same instructions whatever ``M``, and the
chunk boundaries depend on ``K`` only, so a row's result depends only on that row and the
weights (cuBLAS picks its kernel, its split-K and its reduction order from ``M``). The same
additions in the same order run one of two ways, with the same bits:

- ``whole``: one program per tile, looping over the chunks (training batches: enough tiles);
- ``split``: one program per tile and chunk writing its fp32 total, then one kernel adding the
  totals in order (decode batches: a 64 x 128 tile gives a 2048-wide output 16 programs at 8
  rows, too few for a GPU's SMs; a 2048-deep ``K`` gives 4 times as many). Letting each tile's
  last program add them instead (an atomic count per tile) was slower in the 1.1B rollout's
  profile (bench/README.md).

``whole`` takes tiles of `WHOLE_BLOCK_M` rows with twice the warps: on a GPU with warp-group
MMA (Hopper) each group of four warps computes 64 of its rows with the 64-row tile's
instructions, so a row's bits are those of the 64-row tile (bench/exact_kernels.py checks it on
the GPU: every layer's rows equal between the two layouts at every batch size).

Rounded to the inputs' dtype once, at the end. Runs on CPU tensors under ``TRITON_INTERPRET=1``
(tests).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

# The one configuration (bf16: bench/exact_kernels.py measures it against cuBLAS).
BLOCK_M, BLOCK_N, BLOCK_K = 64, 128, 64
CHUNK_K = 512  # the sum's fixed chunks: 8 steps of BLOCK_K
GROUP_M = 8  # whole: tiles visited in groups of 8 row blocks, so a weight tile stays in L2
NUM_WARPS, NUM_STAGES = 4, 4
WHOLE_BLOCK_M, WHOLE_WARPS = 128, 8  # two warp groups of the 64-row tile's 4 warps


@triton.jit
def _chunk_total(a_ptr, b_ptr, rows, cols, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                 first, CHUNK_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, IEEE: tl.constexpr):
    inner = tl.arange(0, BLOCK_K)
    part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(first, tl.minimum(first + CHUNK_K, K), BLOCK_K):
        ks = k + inner
        a = tl.load(a_ptr + rows[:, None] * stride_am + ks[None, :] * stride_ak,
                    mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)
        b = tl.load(b_ptr + ks[:, None] * stride_bk + cols[None, :] * stride_bn,
                    mask=(ks[:, None] < K) & (cols[None, :] < N), other=0.0)
        if IEEE:
            part = tl.dot(a, b, part, input_precision="ieee")
        else:
            part = tl.dot(a, b, part)
    return part


@triton.jit
def _whole_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                  stride_cm, stride_cn, CHUNK_K: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                  IEEE: tl.constexpr):
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
    total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for first in range(0, K, CHUNK_K):
        total += _chunk_total(a_ptr, b_ptr, rows, cols, M, N, K, stride_am, stride_ak,
                              stride_bk, stride_bn, first, CHUNK_K, BLOCK_M, BLOCK_N, BLOCK_K,
                              IEEE)
    tl.store(c_ptr + rows[:, None] * stride_cm + cols[None, :] * stride_cn,
             total.to(c_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))


@triton.jit
def _split_kernel(a_ptr, b_ptr, totals_ptr, M, N, K, stride_am, stride_ak, stride_bk,
                  stride_bn, CHUNK_K: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr):
    blocks_n = tl.cdiv(N, BLOCK_N)
    tile = tl.program_id(0)
    chunk = tl.program_id(1)
    rows = (tile // blocks_n) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = (tile % blocks_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    part = _chunk_total(a_ptr, b_ptr, rows, cols, M, N, K, stride_am, stride_ak, stride_bk,
                        stride_bn, chunk * CHUNK_K, CHUNK_K, BLOCK_M, BLOCK_N, BLOCK_K, IEEE)
    tl.store(totals_ptr + chunk * M * N + rows[:, None] * N + cols[None, :], part,
             mask=(rows[:, None] < M) & (cols[None, :] < N))


@triton.jit
def _add_totals_kernel(totals_ptr, c_ptr, M, N, stride_cm, stride_cn, chunks,
                       BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < M * N
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    for chunk in range(0, chunks):  # in order, from zero: the whole kernel's additions
        total += tl.load(totals_ptr + chunk * M * N + offsets, mask=inside, other=0.0)
    tl.store(c_ptr + (offsets // N) * stride_cm + (offsets % N) * stride_cn,
             total.to(c_ptr.dtype.element_ty), mask=inside)


@functools.cache
def _multiprocessors(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def split_pays(rows: int, cols: int, inner: int, device: torch.device) -> bool:
    """Whether ``split`` suits an ``(rows, inner) x (inner, cols)`` product: more than one
    chunk, and fewer tiles than the GPU has multiprocessors (a CPU tensor, under the
    interpreter, counts 132). At the 1.1B shapes split is the faster of the two for exactly
    these products (bench/exact_kernels.py, its results in bench/results/exact_kernels.json)."""
    tiles = triton.cdiv(rows, BLOCK_M) * triton.cdiv(cols, BLOCK_N)
    units = _multiprocessors(device.index or 0) if device.type == "cuda" else 132
    return inner > CHUNK_K and tiles < units


def invariant_mm(a: torch.Tensor, b: torch.Tensor, *, split: bool | None = None) -> torch.Tensor:
    """``a (M, K) @ b (K, N)`` in ``a``'s dtype (fp32 inputs multiply in IEEE fp32, not TF32),
    every row computed by the same tile program whatever ``M``. ``split`` picks the layout
    (default: `split_pays`); both give the same bits."""
    if a.dtype != b.dtype:
        raise TypeError(f"exact matmul of {a.dtype} by {b.dtype}: cast one first")
    rows, inner = a.shape
    cols = b.shape[1]
    out = torch.empty((rows, cols), dtype=a.dtype, device=a.device)
    if rows == 0 or cols == 0:
        return out
    if inner == 0:
        return out.zero_()
    if split is None:
        split = split_pays(rows, cols, inner, a.device)
    tiles = triton.cdiv(rows, BLOCK_M) * triton.cdiv(cols, BLOCK_N)
    strides = (a.stride(0), a.stride(1), b.stride(0), b.stride(1))
    blocks = {"CHUNK_K": CHUNK_K, "BLOCK_N": BLOCK_N, "BLOCK_K": BLOCK_K,
              "IEEE": a.dtype == torch.float32}
    if not split:
        # fp32 tiles are twice the bytes: three stages fit the shared memory, four do not
        stages = NUM_STAGES if a.element_size() < 4 else NUM_STAGES - 1
        grid = (triton.cdiv(rows, WHOLE_BLOCK_M) * triton.cdiv(cols, BLOCK_N),)
        _whole_kernel[grid](a, b, out, rows, cols, inner, *strides, out.stride(0), out.stride(1),
                            BLOCK_M=WHOLE_BLOCK_M, GROUP_M=GROUP_M, **blocks,
                            num_warps=WHOLE_WARPS, num_stages=stages)
        return out
    chunks = triton.cdiv(inner, CHUNK_K)
    totals = torch.empty((chunks, rows, cols), dtype=torch.float32, device=a.device)
    _split_kernel[(tiles, chunks)](a, b, totals, rows, cols, inner, *strides,
                                   BLOCK_M=BLOCK_M, **blocks, num_warps=NUM_WARPS,
                                   num_stages=NUM_STAGES)
    _add_totals_kernel[(triton.cdiv(rows * cols, 1024),)](totals, out, rows, cols,
                                                          out.stride(0), out.stride(1), chunks,
                                                          BLOCK=1024)
    return out
