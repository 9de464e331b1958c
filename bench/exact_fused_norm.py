"""The RMSNorm of ``rollout.exact`` as one Triton kernel (#27's next step, a prototype to measure;
the core does not use it).

Inside `graft.engine.exact.exact_kernels` a transformers RMSNorm (``x.float()``, ``pow(2)``,
``mean``, ``+ eps``, ``rsqrt``, ``*``, the cast back, ``weight *``) runs as about ten kernels, the
mean as `graft.engine.exact.triton_reductions.row_sum` (1024 fp32 lanes filled block by block in
order, then ``tl.sum``); in the exact 1.1B rollout on an H100 the decode step launched about
1,280 kernels against the default's 480 (bench/README.md, "Exact kernels"). Here one program per
row does the same operations in the same order with the same rounding points: the lanes and
their sum as ``row_sum``'s (same block, same warps), the division by the width IEEE, then
``rsqrt``, the products and the two casts. A row's result depends only on that row, as before.

Measured, on one GPU, at the 1.1B hidden size (2048), bf16: the time of the exact eager chain and
of this kernel as the decode loop pays it (a CUDA graph of 20 calls, replayed) at M = 8, 32,
256, 2048 and 16384 rows, and whether the kernel's output is bit-equal to the eager chain's
(then it could replace it on both the rollout's and the trainer's side without changing a bit).

    python3 bench/exact_fused_norm.py --out $OUT/exact_fused_norm.json
    TRITON_INTERPRET=1 python bench/exact_fused_norm.py --interpret   # close and row-invariant on CPU
"""

from __future__ import annotations

import json
from typing import Any

import torch
import triton
import triton.language as tl
from kernel_prototype import prototype_main
from timing import graph_ms

LANES = 1024  # graft.engine.exact.triton_reductions.BLOCK
HIDDEN, EPS = 2048, 1e-5


@triton.jit
def _rms_norm_kernel(x_ptr, weight_ptr, out_ptr, width, stride_row, eps, LANES: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    lanes = tl.arange(0, LANES)
    acc = tl.zeros((LANES,), dtype=tl.float32)
    for start in range(0, width, LANES):
        cols = start + lanes
        x = tl.load(x_ptr + row * stride_row + cols, mask=cols < width, other=0.0).to(tl.float32)
        acc += x * x
    variance = tl.math.div_rn(tl.sum(acc, axis=0), width.to(tl.float32))
    scale = tl.math.rsqrt(variance + eps)
    for start in range(0, width, LANES):
        cols = start + lanes
        inside = cols < width
        x = tl.load(x_ptr + row * stride_row + cols, mask=inside, other=0.0).to(tl.float32)
        normed = (x * scale).to(out_ptr.dtype.element_ty).to(tl.float32)
        weight = tl.load(weight_ptr + cols, mask=inside, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * stride_row + cols, (weight * normed).to(out_ptr.dtype.element_ty),
                 mask=inside)


def fused_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * (x.float() * rsqrt(mean(x.float() ** 2) + eps)).to(x.dtype)`` per row of a
    contiguous 2-D ``x``, in one kernel."""
    out = torch.empty_like(x)
    if x.shape[0]:
        _rms_norm_kernel[(x.shape[0],)](x, weight, out, x.shape[1], x.stride(0), eps,
                                        LANES=LANES, num_warps=4)
    return out


def eager_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' RMSNorm, operation for operation (run inside the exact kernels' mode)."""
    hidden = x.to(torch.float32)
    variance = hidden.pow(2).mean(-1, keepdim=True)
    hidden = hidden * torch.rsqrt(variance + eps)
    return weight * hidden.to(x.dtype)


def check_interpreted() -> None:
    """On CPU: close to the formula, and a row's bits the same in a batch of 1 and of 50."""
    torch.manual_seed(0)
    x, weight = torch.randn(50, 2500), torch.randn(2500)
    out = fused_rms_norm(x, weight, EPS)
    torch.testing.assert_close(out, eager_rms_norm(x, weight, EPS), rtol=1e-5, atol=1e-5)
    for first, count in ((0, 1), (7, 3), (49, 1)):
        assert torch.equal(fused_rms_norm(x[first:first + count], weight, EPS),
                           out[first:first + count])


def measure(device: torch.device) -> list[dict[str, Any]]:
    from graft.engine.exact import exact_kernels

    torch.manual_seed(0)
    x = torch.randn(16384, HIDDEN, device=device).to(torch.bfloat16)
    weight = (1 + 0.1 * torch.randn(HIDDEN, device=device)).to(torch.bfloat16)
    rows = []
    for m in (8, 32, 256, 2048, 16384):
        part = x[:m]
        with exact_kernels():
            eager = eager_rms_norm(part, weight, EPS)
            eager_ms = graph_ms(lambda p=part: eager_rms_norm(p, weight, EPS))
        fused = fused_rms_norm(part, weight, EPS)
        rows.append({"rows": m, "eager_exact_ms": round(eager_ms, 4),
                     "fused_ms": round(graph_ms(lambda p=part: fused_rms_norm(p, weight, EPS)), 4),
                     "bit_equal_to_eager_exact": torch.equal(fused, eager),
                     "max_abs_diff": float((fused.float() - eager.float()).abs().max()),
                     "rows_invariant": torch.equal(fused_rms_norm(part[:1], weight, EPS),
                                                   fused[:1])})
        print(json.dumps(rows[-1]), flush=True)
    return rows


if __name__ == "__main__":
    prototype_main(__doc__.splitlines()[0], check=check_interpreted, measure=measure,
                   settings={"hidden": HIDDEN})
