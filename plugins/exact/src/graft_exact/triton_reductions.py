"""Row sums on CUDA that do not depend on the number of rows: one Triton program per row.

A program walks its row in blocks of `BLOCK` elements, in order, adding each block into a
``BLOCK``-lane fp32 accumulator, then sums the lanes with a fixed tree (``tl.sum``). Zeros past
the end of the row (padding) add nothing to any lane, so a padded row sums to the same bits.
ATen's CUDA reductions split a few long rows over several blocks (and change the split with
the number of rows); this never splits a row. Runs under ``TRITON_INTERPRET=1`` on CPU (tests).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024


@triton.jit
def _row_sum_kernel(x_ptr, out_ptr, n, stride_row, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    lanes = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, n, BLOCK):
        cols = start + lanes
        acc += tl.load(x_ptr + row * stride_row + cols, mask=cols < n, other=0.0).to(tl.float32)
    tl.store(out_ptr + row, tl.sum(acc, axis=0))


def row_sum(x: torch.Tensor) -> torch.Tensor:
    """The fp32 sum over the last dimension of ``x`` (any float dtype), shape ``x.shape[:-1]``."""
    flat = x.reshape(-1, x.shape[-1])
    if flat.shape[-1] and flat.stride(-1) != 1:
        flat = flat.contiguous()
    out = torch.empty(flat.shape[0], dtype=torch.float32, device=x.device)
    if flat.shape[0] == 0:
        return out.reshape(x.shape[:-1])
    if flat.shape[1] == 0:
        return out.zero_().reshape(x.shape[:-1])
    _row_sum_kernel[(flat.shape[0],)](flat, out, flat.shape[1], flat.stride(0), BLOCK=BLOCK)
    return out.reshape(x.shape[:-1])
