"""The exact MoE experts on CUDA: one grouped Triton product per projection, no host sync.

Every (token, chosen expert) pair is one row. The rows are sorted by expert and each expert's
rows padded to whole blocks of `BLOCK_M` (`graft_exact.pair_plan`); one program computes
one ``BLOCK_M x BLOCK_N`` tile of one expert's rows, looping over ``K`` in ``BLOCK_K`` steps in
order with an fp32 accumulator, as `graft_exact.triton_matmul` does for a plain
product. A row's result depends only on that row and its expert's weights, whatever the batch,
the other tokens' experts or where the row lands in its tile, so a token's expert output is the
same in a decode step and in a packed training row. transformers' ``eager`` experts (the CPU
path) find the hit experts with ``nonzero`` on the host, which a CUDA graph cannot capture
(graft-graphed-decode's `graft_graphed_decode.capturable`).

The backward is the ordinary one (a loop over the hit experts, outside the exact kernels):
gradients need not be batch-invariant. Runs on CPU tensors under ``TRITON_INTERPRET=1`` (tests).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from graft_exact.pair_plan import PairPlan, plan_pairs

# The one configuration, as the plain exact product's (`graft_exact.triton_matmul`).
BLOCK_M, BLOCK_N, BLOCK_K = 64, 128, 64
NUM_WARPS, NUM_STAGES = 4, 4


@triton.jit
def _grouped_kernel(x_ptr, w_ptr, out_ptr, rows_ptr, block_expert_ptr, N, K,
                    stride_xm, stride_xk, stride_we, stride_wn, stride_wk, stride_om, stride_on,
                    PAIRS_PER_ROW: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr, IEEE: tl.constexpr):
    block = tl.program_id(0)
    expert = tl.load(block_expert_ptr + block)
    if expert < 0:
        return
    pairs = tl.load(rows_ptr + block * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = pairs >= 0
    inputs = tl.where(valid, pairs // PAIRS_PER_ROW, 0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    inner = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        ks = k + inner
        a = tl.load(x_ptr + inputs[:, None] * stride_xm + ks[None, :] * stride_xk,
                    mask=valid[:, None] & (ks[None, :] < K), other=0.0)
        b = tl.load(w_ptr + expert * stride_we + ks[:, None] * stride_wk + cols[None, :] * stride_wn,
                    mask=(ks[:, None] < K) & (cols[None, :] < N), other=0.0)
        if IEEE:
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
    tl.store(out_ptr + tl.where(valid, pairs, 0)[:, None] * stride_om + cols[None, :] * stride_on,
             acc.to(out_ptr.dtype.element_ty), mask=valid[:, None] & (cols[None, :] < N))


def _grouped_product(x: torch.Tensor, weight: torch.Tensor, plan: PairPlan,
                     pairs_per_row: int) -> torch.Tensor:
    """``(pairs, N)``: pair ``p``'s row is ``x[p // pairs_per_row] @ weight[expert(p)].T``
    (``weight`` ``(E, N, K)``), in ``x``'s dtype."""
    if x.dtype != weight.dtype:
        raise TypeError(f"exact experts of {x.dtype} by {weight.dtype}: cast one first")
    n, k = weight.shape[1], weight.shape[2]
    out = torch.empty((plan.pair_expert.numel(), n), dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out
    grid = (plan.block_expert.numel(), triton.cdiv(n, BLOCK_N))
    _grouped_kernel[grid](x, weight, out, plan.rows, plan.block_expert, n, k, x.stride(0),
                          x.stride(1), weight.stride(0), weight.stride(1), weight.stride(2),
                          out.stride(0), out.stride(1), PAIRS_PER_ROW=pairs_per_row,
                          BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
                          IEEE=x.dtype == torch.float32, num_warps=NUM_WARPS,
                          num_stages=NUM_STAGES)
    return out


class GroupedProduct(torch.autograd.Function):
    """`_grouped_product` with the ordinary gradient (a loop over the hit experts)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, plan: PairPlan,
                pairs_per_row: int) -> torch.Tensor:
        ctx.save_for_backward(x, weight, plan.pair_expert)
        ctx.pairs_per_row = pairs_per_row
        return _grouped_product(x, weight, plan, pairs_per_row)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        from graft_exact.mode import ordinary_kernels

        x, weight, pair_expert = ctx.saved_tensors
        source = torch.arange(pair_expert.numel(), device=x.device) // ctx.pairs_per_row
        with ordinary_kernels():
            grad_rows = grad_out.new_zeros((pair_expert.numel(), weight.shape[2]))
            grad_weight = torch.zeros_like(weight)
            order = torch.argsort(pair_expert, stable=True)
            counts = torch.bincount(pair_expert, minlength=weight.shape[0]).tolist()
            for expert, pairs in enumerate(order.split(counts)):
                if pairs.numel():
                    grad = grad_out[pairs]
                    grad_rows[pairs] = grad @ weight[expert]
                    grad_weight[expert] = grad.t() @ x[source[pairs]]
            grad_x = torch.zeros_like(x).index_add_(0, source, grad_rows.to(x.dtype))
        return grad_x, grad_weight, None, None


def grouped_product(x: torch.Tensor, weight: torch.Tensor, plan: PairPlan,
                    pairs_per_row: int) -> torch.Tensor:
    """Differentiable `_grouped_product` (``x`` ``(rows, K)``, ``weight`` ``(E, N, K)``)."""
    return GroupedProduct.apply(x, weight, plan, pairs_per_row)


def triton_experts_forward(experts: torch.nn.Module, hidden_states: torch.Tensor,
                           top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
    """A transformers experts module's forward (``gate_up_proj``/``up_proj`` and ``down_proj``
    as ``(E, out, in)``, no biases) with `grouped_product`: ``(tokens, hidden)``. Each token's
    chosen experts' outputs are weighted and summed over its ``k`` choices in their order
    (inside `graft_exact.exact_kernels` the sum is the exact tree sum)."""
    tokens, top_k = top_k_index.shape
    plan = plan_pairs(top_k_index.reshape(-1), experts.num_experts, BLOCK_M)
    up_weight = experts.gate_up_proj if experts.has_gate else experts.up_proj
    up = grouped_product(hidden_states, up_weight, plan, top_k)
    up = experts._apply_gate(up) if experts.has_gate else experts.act_fn(up)
    down = grouped_product(up, experts.down_proj, plan, 1)
    weighted = down * top_k_weights.reshape(-1, 1).to(down.dtype)
    return weighted.view(tokens, top_k, -1).sum(dim=1).to(hidden_states.dtype)
