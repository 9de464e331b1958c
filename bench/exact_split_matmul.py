"""A batch-invariant product with more programs at decode sizes: ``K`` summed in fixed chunks
(#27's next step, a prototype to measure; the core does not use it).

`graft.engine.exact.triton_matmul` gives every ``M`` one program per 64 x 128 output tile with
the whole ``K`` in one accumulator. At a decode batch of 8 to 256 rows that is 16 to 64 programs
for a 2048-wide output, too few for a GPU's 132 SMs: the exact product was 0.65 s of the 1.25 s
of GPU time of the 1.1B exact rollout on an H100 (bench/README.md, "Exact kernels"). Splitting
``K`` over programs is what cuBLAS does there, but a split chosen by ``M`` changes a row's sum.

Here the ``K`` loop is cut at fixed boundaries, every `CHUNK_K`: each chunk's products
accumulate from zero, and the chunk totals are added in order. The boundaries depend on ``K``
only, so the same additions in the same order can run two ways: ``whole``, one program per
tile looping over the chunks (training batches), or ``split``, one program per (tile, chunk)
writing its fp32 total, then a kernel adding them in order (decode batches). A row's bits are
the same whichever way its batch took. The tiles are a plain grid (the current kernel visits
them in groups of 8 row blocks, for the L2 cache): the order changes the speed, not the bits,
so the training sizes' times here may be a little slower than a final kernel's.

Measured, at the 1.1B shapes of bench/exact_kernels.py, bf16, one GPU: each product's time as
the decode loop pays it (a CUDA graph of 20 calls, replayed), for M = 8, 32, 256 (decode) and
2048, 16384 (training): cuBLAS, the current exact kernel, ``whole`` and ``split``; and whether
the rows of ``split`` at each M and of ``whole`` at each M equal ``whole``'s at 16384 rows.

    python3 bench/exact_split_matmul.py --out $OUT/exact_split_matmul.json
    TRITON_INTERPRET=1 python bench/exact_split_matmul.py --interpret   # the bits, small, on CPU
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import torch
import triton
import triton.language as tl
from kernel_prototype import prototype_main
from timing import graph_ms

BLOCK_M, BLOCK_N, BLOCK_K = 64, 128, 64  # the current exact kernel's tile
CHUNK_K = 512
LINEARS = {"q/o": (2048, 2048), "k/v": (2048, 256), "gate/up": (2048, 5632),
           "down": (5632, 2048), "head": (2048, 32000)}


@triton.jit
def _chunk_total(a_ptr, b_ptr, rows, cols, M, N, K, stride_am, stride_ak, stride_bk,
                 stride_bn, first, CHUNK_K: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    inner = tl.arange(0, BLOCK_K)
    part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(first, first + CHUNK_K, BLOCK_K):
        ks = k + inner
        a = tl.load(a_ptr + rows[:, None] * stride_am + ks[None, :] * stride_ak,
                    mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)
        b = tl.load(b_ptr + ks[:, None] * stride_bk + cols[None, :] * stride_bn,
                    mask=(ks[:, None] < K) & (cols[None, :] < N), other=0.0)
        part = tl.dot(a, b, part)
    return part


@triton.jit
def _whole_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                  stride_cm, stride_cn, CHUNK_K: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for first in range(0, K, CHUNK_K):
        total += _chunk_total(a_ptr, b_ptr, rows, cols, M, N, K, stride_am, stride_ak,
                              stride_bk, stride_bn, first, CHUNK_K, BLOCK_M, BLOCK_N, BLOCK_K)
    tl.store(c_ptr + rows[:, None] * stride_cm + cols[None, :] * stride_cn,
             total.to(c_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))


@triton.jit
def _split_kernel(a_ptr, b_ptr, partial_ptr, M, N, K, stride_am, stride_ak, stride_bk,
                  stride_bn, CHUNK_K: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    chunk = tl.program_id(2)
    part = _chunk_total(a_ptr, b_ptr, rows, cols, M, N, K, stride_am, stride_ak, stride_bk,
                        stride_bn, chunk * CHUNK_K, CHUNK_K, BLOCK_M, BLOCK_N, BLOCK_K)
    tl.store(partial_ptr + chunk * M * N + rows[:, None] * N + cols[None, :], part,
             mask=(rows[:, None] < M) & (cols[None, :] < N))


@triton.jit
def _add_chunks_kernel(partial_ptr, c_ptr, size, chunks, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < size
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    for chunk in range(0, chunks):
        total += tl.load(partial_ptr + chunk * size + offsets, mask=inside, other=0.0)
    tl.store(c_ptr + offsets, total.to(c_ptr.dtype.element_ty), mask=inside)


def chunked_mm(a: torch.Tensor, b: torch.Tensor, *, split: bool,
               chunk_k: int = CHUNK_K) -> torch.Tensor:
    """``a (M, K) @ b (K, N)`` in ``a``'s dtype, ``K`` summed in chunks of ``chunk_k`` added in
    order: by one program per tile (``split`` false) or one per (tile, chunk) and a sum."""
    rows, inner = a.shape
    cols = b.shape[1]
    out = torch.empty((rows, cols), dtype=a.dtype, device=a.device)
    if rows == 0 or cols == 0:
        return out
    tiles = (triton.cdiv(rows, BLOCK_M), triton.cdiv(cols, BLOCK_N))
    strides = (a.stride(0), a.stride(1), b.stride(0), b.stride(1))
    blocks = {"CHUNK_K": chunk_k, "BLOCK_M": BLOCK_M, "BLOCK_N": BLOCK_N, "BLOCK_K": BLOCK_K}
    if not split:
        _whole_kernel[tiles](a, b, out, rows, cols, inner, *strides, out.stride(0),
                             out.stride(1), **blocks, num_warps=4, num_stages=4)
        return out
    chunks = triton.cdiv(inner, chunk_k)
    partial = torch.empty((chunks, rows, cols), dtype=torch.float32, device=a.device)
    _split_kernel[(*tiles, chunks)](a, b, partial, rows, cols, inner, *strides, **blocks,
                                    num_warps=4, num_stages=4)
    size = rows * cols
    _add_chunks_kernel[(triton.cdiv(size, 1024),)](partial, out, size, chunks, BLOCK=1024)
    return out


def same_rows(product: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
              reference: torch.Tensor, counts: tuple[int, ...]) -> bool:
    """Whether ``product`` of the first ``count`` rows of ``x`` is ``reference``'s rows, bit for
    bit, for each count."""
    return all(torch.equal(product(x[:count]), reference[:count]) for count in counts)


def check_interpreted() -> None:
    """The bits on CPU, small: ``split`` and ``whole`` agree at every M and with the rows of a
    larger batch, ``K`` not a multiple of a chunk."""
    torch.manual_seed(0)
    a, w = torch.randn(140, 300), torch.randn(72, 300)
    whole = chunked_mm(a, w.t(), split=False, chunk_k=128)
    for count in (1, 3, 64, 70, 140):
        for split in (True, False):
            assert torch.equal(chunked_mm(a[:count], w.t(), split=split, chunk_k=128),
                               whole[:count]), (count, split)
    torch.testing.assert_close(whole, a @ w.t(), rtol=1e-5, atol=1e-4)


def measure_linear(name: str, inner: int, outer: int, device: torch.device
                   ) -> list[dict[str, Any]]:
    """One layer's product at each M: times, and the rows against ``whole`` at 16384 rows."""
    from graft.engine.exact.triton_matmul import invariant_mm

    torch.manual_seed(0)
    weight = ((torch.randn(outer, inner, device=device) / inner ** 0.5).to(torch.bfloat16)).t()
    x = torch.randn(16384, inner, device=device).to(torch.bfloat16)
    reference = chunked_mm(x, weight, split=False)
    rows = []
    for m in (8, 32, 256, 2048, 16384):
        part = x[:m]
        row = {"shape": f"{name} M={m} K={inner} N={outer}",
               "cublas_ms": graph_ms(lambda p=part: torch.mm(p, weight)),
               "exact_ms": graph_ms(lambda p=part: invariant_mm(p, weight)),
               "whole_ms": graph_ms(lambda p=part: chunked_mm(p, weight, split=False)),
               "whole_rows_equal": same_rows(lambda t: chunked_mm(t, weight, split=False), x,
                                             reference, (m,))}
        if m <= 2048:
            row["split_ms"] = graph_ms(lambda p=part: chunked_mm(p, weight, split=True))
            row["split_rows_equal"] = same_rows(lambda t: chunked_mm(t, weight, split=True), x,
                                                reference, (m,))
        rows.append({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def measure(device: torch.device) -> list[dict[str, Any]]:
    return [row for name, (inner, outer) in LINEARS.items()
            for row in measure_linear(name, inner, outer, device)]


if __name__ == "__main__":
    prototype_main(__doc__.splitlines()[0], check=check_interpreted, measure=measure,
                   settings={"chunk_k": CHUNK_K})
