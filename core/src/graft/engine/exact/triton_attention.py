"""The exact attention on CUDA: one Triton program per (query, key head) over its key window.

Each query attends the keys of one contiguous window (`graft.engine.exact.attention`: from its
sample's first token), given as ``start`` and ``count`` per query, computed from the mask on
the device (no host synchronisation, so a CUDA graph can capture it). The program loads the
query heads that share a key head (one ``tl.dot`` operand, padded to 16 rows: a head is always
the same row, whichever pass), and walks the window in blocks of `BLOCK_N` keys from its start,
in order, with the online softmax: every block holds at least one attended key, so a query's
result depends only on its ``count`` keys, in the same order, for a packed training row, a
prefill and a decode step over a longer cache alike. ``p`` is rounded to the values' dtype
before ``p . v`` (one rounding point, the same everywhere). The mask's contiguity is checked on
CPU (the same model code builds the masks); here it is trusted.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

BLOCK_N = 64


@triton.jit
def _window_attention_kernel(q_ptr, k_ptr, v_ptr, o_ptr, start_ptr, count_ptr, scale,
                             kv_heads, queries,
                             sqb, sqh, sqq, sqd, skb, skh, skn, skd, svb, svh, svn, svd,
                             sob, soq, soh, sod, GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
                             DIM: tl.constexpr, BLOCK_D: tl.constexpr, DIM_V: tl.constexpr,
                             BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr,
                             IEEE: tl.constexpr):
    query = tl.program_id(0)
    pair = tl.program_id(1)
    batch = pair // kv_heads
    head = pair % kv_heads
    start = tl.load(start_ptr + batch * queries + query)
    count = tl.load(count_ptr + batch * queries + query)
    group = tl.arange(0, BLOCK_G)
    dims = tl.arange(0, BLOCK_D)
    dims_v = tl.arange(0, BLOCK_DV)
    heads = head * GROUP + group
    q = tl.load(q_ptr + batch * sqb + heads[:, None] * sqh + query * sqq + dims[None, :] * sqd,
                mask=(group[:, None] < GROUP) & (dims[None, :] < DIM), other=0.0)
    top = tl.full((BLOCK_G,), float("-inf"), dtype=tl.float32)
    total = tl.zeros((BLOCK_G,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_G, BLOCK_DV), dtype=tl.float32)
    keys = tl.arange(0, BLOCK_N)
    for first in range(0, count, BLOCK_N):
        offsets = first + keys
        valid = offsets < count
        slots = start + offsets
        k = tl.load(k_ptr + batch * skb + head * skh + slots[None, :] * skn + dims[:, None] * skd,
                    mask=valid[None, :] & (dims[:, None] < DIM), other=0.0)
        if IEEE:
            scores = tl.dot(q, k, input_precision="ieee") * scale
        else:
            scores = tl.dot(q, k) * scale
        scores = tl.where(valid[None, :], scores, float("-inf"))
        new_top = tl.maximum(top, tl.max(scores, axis=1))
        rescale = tl.exp(top - new_top)
        p = tl.exp(scores - new_top[:, None])
        total = total * rescale + tl.sum(p, axis=1)
        v = tl.load(v_ptr + batch * svb + head * svh + slots[:, None] * svn + dims_v[None, :] * svd,
                    mask=valid[:, None] & (dims_v[None, :] < DIM_V), other=0.0)
        if IEEE:
            acc = acc * rescale[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            acc = acc * rescale[:, None] + tl.dot(p.to(v.dtype), v)
        top = new_top
    out = acc / tl.where(total > 0, total, 1.0)[:, None]
    tl.store(o_ptr + batch * sob + query * soq + heads[:, None] * soh + dims_v[None, :] * sod,
             out.to(o_ptr.dtype.element_ty),
             mask=(group[:, None] < GROUP) & (dims_v[None, :] < DIM_V))


def windows(mask: torch.Tensor | None, batch: int, queries: int,
            keys: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Each query's first attended key and key count, ``(B, Q)`` int32 on the device, and the
    number of keys the mask covers (its last dimension; all keys without a mask)."""
    if mask is None:
        count = torch.arange(queries, device=device, dtype=torch.int32) + (keys - queries + 1)
        count = count.clamp(min=0).expand(batch, queries).contiguous()
        return torch.zeros_like(count), count, keys
    attend = mask[:, 0] if mask.dtype == torch.bool else mask[:, 0] == 0
    attend = attend.expand(batch, queries, mask.shape[-1])
    count = attend.sum(-1, dtype=torch.int32)
    start = attend.to(torch.int8).argmax(-1).to(torch.int32)
    return start.contiguous(), count.contiguous(), mask.shape[-1]


def invariant_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        mask: torch.Tensor | None, *, scale: float) -> torch.Tensor:
    """``(B, Q, H, Dv)`` in the query's dtype: query ``(B, H, Q, D)``, key/value
    ``(B, Hkv, K, D)``, a boolean or additive ``(B|1, 1, Q, K')`` mask (or None: causal).
    Differentiable: the gradient is the ordinary attention's (`WindowAttention`)."""
    return WindowAttention.apply(query, key, value, mask, scale)


class WindowAttention(torch.autograd.Function):
    """The Triton forward (`_window_attention`) with the ordinary attention's gradient.

    Only the forward has to be batch-invariant (it computes the logits the rollout samples
    from and the trainer's log-probs); the backward recomputes the same attention with SDPA
    outside the exact kernels (`ordinary_kernels`) and differentiates that. A query that
    attends no key gets output 0 in the forward, a constant, so its gradient is 0: its rows
    are dropped from the recomputation's incoming gradient.
    """

    @staticmethod
    def forward(ctx: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                mask: torch.Tensor | None, scale: float) -> torch.Tensor:
        ctx.save_for_backward(query, key, value, mask)
        ctx.scale = scale
        return _window_attention(query, key, value, mask, scale=scale)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        from graft.engine.exact.mode import ordinary_kernels

        query, key, value, mask = ctx.saved_tensors
        inputs = [t.detach().requires_grad_(needs) for t, needs
                  in zip((query, key, value), ctx.needs_input_grad[:3], strict=True)]
        with torch.enable_grad(), ordinary_kernels():
            out, attends = _reference_attention(*inputs, mask, scale=ctx.scale)
            grad_out = grad_out.masked_fill(~attends.transpose(1, 2)[..., None], 0.0)
            wanted = [t for t in inputs if t.requires_grad]
            grads = iter(torch.autograd.grad(out, wanted, grad_out))
        return (*(next(grads) if t.requires_grad else None for t in inputs), None, None)


def _reference_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         mask: torch.Tensor | None, *, scale: float
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """SDPA over the same keys as `_window_attention`, ``(B, Q, H, Dv)``, and which
    ``(B, 1, Q)`` queries attend any key (the others attend every key here, to stay finite)."""
    batch, heads, queries, _ = query.shape
    keys = key.shape[2] if mask is None else mask.shape[-1]
    if mask is None:
        slots = torch.arange(keys, device=query.device)
        attend = slots[None, :] <= torch.arange(queries, device=query.device)[:, None] + \
            (keys - queries)
        attend = attend[None, None]
    else:
        attend = mask if mask.dtype == torch.bool else mask == 0
    attend = attend.expand(batch, 1, queries, keys)
    attends = attend.any(-1)
    attend = attend | ~attends[..., None]
    group = heads // key.shape[1]
    key = key[:, :, :keys].repeat_interleave(group, 1)
    value = value[:, :, :keys].repeat_interleave(group, 1)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attend,
                                                           scale=scale)
    return out.transpose(1, 2), attends


def _window_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      mask: torch.Tensor | None, *, scale: float) -> torch.Tensor:
    """The Triton kernel's output, ``(B, Q, H, Dv)`` (no autograd)."""
    batch, heads, queries, dim = query.shape
    kv_heads, dim_v = key.shape[1], value.shape[-1]
    start, count, _ = windows(mask, batch, queries, key.shape[2], query.device)
    out = torch.empty((batch, queries, heads, dim_v), dtype=query.dtype, device=query.device)
    if out.numel() == 0:
        return out
    group = heads // kv_heads
    grid = (queries, batch * kv_heads)
    _window_attention_kernel[grid](
        query, key, value, out, start, count, scale, kv_heads, queries, *query.stride(),
        *key.stride(), *value.stride(), *out.stride(), GROUP=group,
        BLOCK_G=max(16, triton.next_power_of_2(group)), DIM=dim,
        BLOCK_D=max(16, triton.next_power_of_2(dim)), DIM_V=dim_v,
        BLOCK_DV=max(16, triton.next_power_of_2(dim_v)), BLOCK_N=BLOCK_N,
        IEEE=query.dtype == torch.float32, num_warps=4)
    return out
