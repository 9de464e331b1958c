"""The exact attention on CUDA: one Triton program per (query, key head) over its key window.

Each query attends the keys of one contiguous window (`graft_exact.attention`: from its
sample's first token): the program finds its ``start`` and ``count`` by scanning its row of
the mask (an integer minimum and sum: no host synchronisation, so a CUDA graph can capture it,
and no kernels of their own in every layer). The program loads the query heads that share a
key head (one ``tl.dot`` operand, padded to 16 rows: a head is always the same row, whichever
pass), and walks the window in blocks of `BLOCK_N` keys from its start,
in order, with the online softmax: every block holds at least one attended key, so a query's
result depends only on its ``count`` keys, in the same order, for a packed training row, a
prefill and a decode step over a longer cache alike. ``p`` is rounded to the values' dtype
before ``p . v`` (one rounding point, the same everywhere). A head's attention sink (``SINKS``)
joins the running max and the normaliser once, after the last block. The mask's contiguity is
checked on CPU (the same model code builds the masks); here it is trusted.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_N = 64
BLOCK_SCAN = 1024  # mask entries a program reads at a time


@triton.jit
def _window(m_ptr, smb, smq, smk, mask_keys, batch, query, keys, queries,
            MASK: tl.constexpr, BOOL_MASK: tl.constexpr, BLOCK_SCAN: tl.constexpr):
    """The query's first attended key and number of keys: from its mask row (``MASK``; a
    boolean mask attends where true, an additive one where 0), else causal, the queries last."""
    if MASK:
        count = tl.zeros((), dtype=tl.int32)
        start = tl.full((), mask_keys, dtype=tl.int32)
        for first in range(0, mask_keys, BLOCK_SCAN):
            slots = first + tl.arange(0, BLOCK_SCAN)
            inside = slots < mask_keys
            entry = tl.load(m_ptr + batch * smb + query * smq + slots * smk, mask=inside, other=0)
            attend = inside & ((entry != 0) if BOOL_MASK else (entry == 0))
            count += tl.sum(attend.to(tl.int32), axis=0)
            start = tl.minimum(start, tl.min(tl.where(attend, slots, mask_keys), axis=0))
    else:
        count = tl.maximum(query + keys - queries + 1, 0)
        start = tl.zeros((), dtype=tl.int32)
    return start, count


@triton.jit
def _window_attention_kernel(q_ptr, k_ptr, v_ptr, o_ptr, m_ptr, s_ptr, scale, kv_heads, queries,
                             keys, mask_keys, sqb, sqh, sqq, sqd, skb, skh, skn, skd, svb, svh, svn,
                             svd, sob, soq, soh, sod, smb, smq, smk, GROUP: tl.constexpr,
                             BLOCK_G: tl.constexpr, DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                             DIM_V: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr,
                             MASK: tl.constexpr, BOOL_MASK: tl.constexpr, SINKS: tl.constexpr,
                             BLOCK_SCAN: tl.constexpr, IEEE: tl.constexpr):
    query = tl.program_id(0)
    pair = tl.program_id(1)
    batch = pair // kv_heads
    head = pair % kv_heads
    start, count = _window(m_ptr, smb, smq, smk, mask_keys, batch, query, keys, queries, MASK,
                           BOOL_MASK, BLOCK_SCAN)
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
    if SINKS:
        sink = tl.load(s_ptr + heads, mask=group < GROUP, other=0.0).to(tl.float32)
        new_top = tl.maximum(top, sink)
        rescale = tl.exp(top - new_top)
        total = total * rescale + tl.exp(sink - new_top)
        acc = acc * rescale[:, None]
    out = acc / tl.where(total > 0, total, 1.0)[:, None]
    tl.store(o_ptr + batch * sob + query * soq + heads[:, None] * soh + dims_v[None, :] * sod,
             out.to(o_ptr.dtype.element_ty),
             mask=(group[:, None] < GROUP) & (dims_v[None, :] < DIM_V))


def _mask_rows(mask: torch.Tensor | None, batch: int, queries: int) -> torch.Tensor | None:
    """The mask as ``(B, Q, K')`` (a view, broadcast dimensions of stride 0)."""
    return None if mask is None else mask[:, 0].expand(batch, queries, mask.shape[-1])


def triton_window_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            mask: torch.Tensor | None, *, scale: float,
                            sinks: torch.Tensor | None = None) -> torch.Tensor:
    """The Triton kernel's output, ``(B, Q, H, Dv)`` (no autograd:
    `graft_exact.attention_grad.invariant_attention`); ``sinks`` ``(H,)``: each head's sink
    logit, or None."""
    batch, heads, queries, dim = query.shape
    kv_heads, dim_v = key.shape[1], value.shape[-1]
    rows = _mask_rows(mask, batch, queries)
    out = torch.empty((batch, queries, heads, dim_v), dtype=query.dtype, device=query.device)
    if out.numel() == 0:
        return out
    group = heads // kv_heads
    grid = (queries, batch * kv_heads)
    mask_args = (query, 0, 0, 0, 0) if rows is None else (rows, *rows.stride(), rows.shape[-1])
    _window_attention_kernel[grid](
        query, key, value, out, mask_args[0], query if sinks is None else sinks.contiguous(),
        scale, kv_heads, queries, key.shape[2],
        mask_args[4], *query.stride(), *key.stride(), *value.stride(), *out.stride(),
        *mask_args[1:4], GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), DIM=dim,
        BLOCK_D=max(16, triton.next_power_of_2(dim)), DIM_V=dim_v,
        BLOCK_DV=max(16, triton.next_power_of_2(dim_v)), BLOCK_N=BLOCK_N,
        MASK=rows is not None, BOOL_MASK=rows is not None and rows.dtype == torch.bool,
        SINKS=sinks is not None, BLOCK_SCAN=BLOCK_SCAN, IEEE=query.dtype == torch.float32,
        num_warps=4)
    return out
