"""SiLU and the sigmoid of the exact kernels on CUDA as one Triton kernel each
(`graft_exact.reductions`' ``exact_silu`` and ``exact_sigmoid``).

An element's result depends only on that element, whatever the kernel, but the eager form
(cast, ``neg``, ``exp``, ``+ 1``, division, cast back) is five or six launches: in the 1.1B exact
rollout 22 of each per decode step. Here ``x / (1 + exp(-x))`` (``1 / (1 + exp(-x))``) in fp32,
cast back once, in one launch. Runs on CPU tensors under ``TRITON_INTERPRET=1`` (tests).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024


@triton.jit
def _logistic_kernel(x_ptr, out_ptr, size, TIMES_X: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < size
    x = tl.load(x_ptr + offsets, mask=inside, other=0.0).to(tl.float32)
    numerator = x if TIMES_X else 1.0
    tl.store(out_ptr + offsets, (numerator / (1.0 + tl.exp(-x))).to(out_ptr.dtype.element_ty),
             mask=inside)


def logistic(x: torch.Tensor, *, times_x: bool) -> torch.Tensor:
    """``x * sigmoid(x)`` (``times_x``, SiLU) or ``sigmoid(x)``, in fp32 for 16-bit ``x``,
    returned in ``x``'s dtype and shape."""
    flat = x.contiguous()
    out = torch.empty_like(flat)
    if flat.numel():
        _logistic_kernel[(triton.cdiv(flat.numel(), BLOCK),)](flat, out, flat.numel(),
                                                              TIMES_X=times_x, BLOCK=BLOCK)
    return out
