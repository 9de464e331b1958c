"""The exact RMSNorm on CUDA as one Triton program per row (`graft_exact.norm`).

Inside `graft_exact.exact_kernels` a transformers RMSNorm ran as about ten kernels (the
cast, ``pow``, the exact mean, ``+ eps``, ``rsqrt``, the products and casts): in the 1.1B exact
rollout 45 norms a decode step, about 450 launches. Here one program walks its row twice in
blocks of `LANES` elements, in order: the squares into ``LANES`` fp32 lanes summed by a fixed
tree (``tl.sum``), then the scaled row, with transformers' rounding points (the normalised row
cast to the input's dtype before the weight multiplies it). A row's result depends only on that
row. Runs on CPU tensors under ``TRITON_INTERPRET=1`` (tests).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

LANES = 1024


@triton.jit
def _rms_norm_kernel(x_ptr, weight_ptr, out_ptr, rstd_ptr, width, stride_x, stride_out,
                     inv_width, eps, LANES: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    lanes = tl.arange(0, LANES)
    squares = tl.zeros((LANES,), dtype=tl.float32)
    for start in range(0, width, LANES):
        cols = start + lanes
        x = tl.load(x_ptr + row * stride_x + cols, mask=cols < width, other=0.0).to(tl.float32)
        squares += x * x
    scale = tl.math.rsqrt(tl.sum(squares, axis=0) * inv_width + eps)
    tl.store(rstd_ptr + row, scale)
    for start in range(0, width, LANES):
        cols = start + lanes
        inside = cols < width
        x = tl.load(x_ptr + row * stride_x + cols, mask=inside, other=0.0).to(tl.float32)
        normed = (x * scale).to(x_ptr.dtype.element_ty).to(tl.float32)
        weight = tl.load(weight_ptr + cols, mask=inside, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * stride_out + cols, (weight * normed).to(out_ptr.dtype.element_ty),
                 mask=inside)


def rms_norm_rows(hidden: torch.Tensor, weight: torch.Tensor,
                  eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight * (h * rstd).to(hidden.dtype)`` with ``h`` the fp32 ``hidden`` and ``rstd =
    rsqrt(mean(h ** 2) + eps)`` over its last dimension, in the dtype ``weight * hidden`` has;
    and ``rstd``, fp32, shaped ``hidden.shape[:-1] + (1,)`` (the backward's)."""
    width = hidden.shape[-1]
    flat = hidden.reshape(-1, width)
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    out = torch.empty(flat.shape, dtype=torch.promote_types(weight.dtype, hidden.dtype),
                      device=hidden.device)
    rstd = torch.empty(flat.shape[0], dtype=torch.float32, device=hidden.device)
    if flat.shape[0] and width:
        _rms_norm_kernel[(flat.shape[0],)](flat, weight.contiguous(), out, rstd, width,
                                           flat.stride(0), out.stride(0), 1.0 / width, eps,
                                           LANES=LANES, num_warps=4)
    return out.reshape(*hidden.shape[:-1], width), rstd.reshape(*hidden.shape[:-1], 1)
