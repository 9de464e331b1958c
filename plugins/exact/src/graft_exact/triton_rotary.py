"""The rotary position embedding of the exact kernels on CUDA: one Triton program per token
(`graft_exact.rotary`).

transformers' ``x * cos + rotate_half(x) * sin`` is about six launches for the queries and six
for the keys (two products, the halves' ``neg`` and ``cat``, the sum), a visible share of the 1.1B
exact rollout's GPU time (see bench/README.md). Here a program rotates every head of one token, with
the eager form's rounding points (each product rounded to the input's dtype, then the sum). An
element's result depends only on that element, its position's table entry and its partner in
the other half. Runs on CPU tensors under ``TRITON_INTERPRET=1`` (tests).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rotary_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, positions, heads, sxb, sxh, sxl, sxd,
                   scb, scl, scd, HALF: tl.constexpr, BLOCK_H: tl.constexpr,
                   BLOCK_HALF: tl.constexpr):
    token = tl.program_id(0)
    batch = token // positions
    position = token % positions
    head = tl.arange(0, BLOCK_H)[:, None]
    lane = tl.arange(0, BLOCK_HALF)[None, :]
    inside = (head < heads) & (lane < HALF)
    x_row = x_ptr + batch * sxb + head * sxh + position * sxl
    first = tl.load(x_row + lane * sxd, mask=inside, other=0.0).to(tl.float32)
    second = tl.load(x_row + (lane + HALF) * sxd, mask=inside, other=0.0).to(tl.float32)
    table = batch * scb + position * scl
    in_half = lane < HALF
    cos_first = tl.load(cos_ptr + table + lane * scd, mask=in_half, other=0.0).to(tl.float32)
    cos_second = tl.load(cos_ptr + table + (lane + HALF) * scd, mask=in_half,
                         other=0.0).to(tl.float32)
    sin_first = tl.load(sin_ptr + table + lane * scd, mask=in_half, other=0.0).to(tl.float32)
    sin_second = tl.load(sin_ptr + table + (lane + HALF) * scd, mask=in_half,
                         other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    # rotate_half(x) = (-second, first); each product rounded to the dtype (the fp32 product
    # of two 16-bit values is exact), then the sum
    out_first = ((first * cos_first).to(dtype).to(tl.float32)
                 + (-second * sin_first).to(dtype).to(tl.float32))
    out_second = ((second * cos_second).to(dtype).to(tl.float32)
                  + (first * sin_second).to(dtype).to(tl.float32))
    out_row = out_ptr + ((batch * heads + head) * positions + position) * (2 * HALF)
    tl.store(out_row + lane, out_first.to(dtype), mask=inside)
    tl.store(out_row + lane + HALF, out_second.to(dtype), mask=inside)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin`` for ``x (B, H, L, D)`` (any strides) and ``cos``,
    ``sin`` ``(B|1, L, D)`` of ``x``'s dtype; contiguous ``(B, H, L, D)``."""
    batch, heads, positions, dim = x.shape
    cos, sin = cos.expand(batch, positions, dim), sin.expand(batch, positions, dim)
    if cos.stride() != sin.stride():  # the kernel reads both tables with one set of strides
        cos, sin = cos.contiguous(), sin.contiguous()
    out = torch.empty((batch, heads, positions, dim), dtype=x.dtype, device=x.device)
    if out.numel():
        _rotary_kernel[(batch * positions,)](
            x, cos, sin, out, positions, heads, *x.stride(), *cos.stride(), HALF=dim // 2,
            BLOCK_H=triton.next_power_of_2(heads), BLOCK_HALF=triton.next_power_of_2(dim // 2),
            num_warps=4)
    return out
