"""Attention whose output for a query depends only on the keys it attends to, in their order.

The trainer attends over a packed row (several samples back to back, a block-diagonal causal
mask), the rollout's prefill over left-padded prompts and each decode step from one query over
the KV cache: the same token sees the same keys at other offsets of other tensors. SDPA (and
flash kernels) split the keys into blocks at fixed offsets of the tensor and reduce per block,
so where a sample starts in its row changes the rounding. Here every query's keys are taken as a
window starting at its first attended key (its sample's first token; the mask must attend a
contiguous range, as causal, packed and left-padded masks do) and reduced in the window's own
order: ``q . k`` as a pairwise tree over the head dimension, the softmax's max (exact in any
order), ``exp(s - max)``, and both sums over the keys (the normaliser and ``p . v``) as pairwise
trees over the window (`graft_exact.reductions.tree_sum`), whose width, a power of two,
does not change the result. Two passes (max, then sums) and fp32 throughout; the output in the
query's dtype. A head's attention sink (GPT-OSS's ``sinks``, transformers' ``s_aux``: a logit
with no value, which only enlarges the softmax's normaliser) joins the max and is added to the
normaliser after the window's tree, in the same place for every query.

On CUDA the forward is one Triton kernel (`graft_exact.triton_attention`); on either
device the gradient is the ordinary attention's (`graft_exact.attention_grad`).

Registered in transformers' attention registry (and its mask registry, so transformers builds a
boolean mask for it, never skipping it for ``is_causal``) as `EXACT_ATTENTION`.
"""

from __future__ import annotations

from typing import Any

import torch

from graft_exact.attention_grad import invariant_attention
from graft_exact.reductions import tree_sum

EXACT_ATTENTION = "graft_exact"
# fp32 elements of the largest (queries x window x head dim) product held at once.
CHUNK_ELEMENTS = 1 << 24


class ExactAttentionError(ValueError):
    """A mask the exact attention cannot serve (keys not one contiguous range per query)."""


def exact_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                            value: torch.Tensor, attention_mask: torch.Tensor | None,
                            scaling: float | None = None, dropout: float = 0.0,
                            **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention interface: ``query (B, H, Q, D)``, ``key``/``value``
    ``(B, Hkv, K, D)`` (query head ``h`` uses key head ``h // (H / Hkv)``), a boolean or
    additive ``attention_mask (B|1, 1, Q, K')`` (``K' <= K``: the first ``K'`` keys; None:
    causal, the queries last) and optionally ``s_aux`` ``(H,)``, each head's sink logit;
    returns ``(B, Q, H, Dv)`` and no weights."""
    if dropout:
        raise ExactAttentionError("exact attention has no dropout; set attention_dropout=0")
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    return invariant_attention(query, key, value, attention_mask, scale=scale,
                               sinks=kwargs.get("s_aux")), None


def cpu_window_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         mask: torch.Tensor | None, *, scale: float,
                         sinks: torch.Tensor | None = None) -> torch.Tensor:
    """The exact attention's forward on CPU (no autograd: `WindowAttention`), ``(B, Q, H, Dv)``
    in the query's dtype, queries taken a chunk at a time; ``sinks`` ``(H,)``: each head's sink
    logit, or None."""
    batch, heads, queries, dim = query.shape
    attend = _attended(mask, batch, queries, key.shape[2], query.device)
    key, value = key[:, :, :attend.shape[-1]], value[:, :, :attend.shape[-1]]
    start, count = _windows(attend)
    out = torch.empty((batch, heads, queries, value.shape[-1]), dtype=torch.float32,
                      device=query.device)
    width = 1 << max(int(count.max()) - 1, 0).bit_length() if count.numel() else 1
    step = max(1, CHUNK_ELEMENTS // max(batch * heads * width * max(dim, value.shape[-1]), 1))
    for first in range(0, queries, step):
        part = slice(first, min(first + step, queries))
        out[:, :, part] = _attend_window(query[:, :, part], key, value, start[:, part],
                                         count[:, part], width, scale, sinks)
    return out.to(query.dtype).transpose(1, 2).contiguous()


def _attended(mask: torch.Tensor | None, batch: int, queries: int, keys: int,
              device: torch.device) -> torch.Tensor:
    """The mask as ``(B, Q, K')`` booleans (True: attend)."""
    if mask is None:
        slots = torch.arange(keys, device=device)
        causal = slots[None, :] <= torch.arange(queries, device=device)[:, None] + (keys - queries)
        return causal[None].expand(batch, queries, keys)
    if mask.dim() != 4 or mask.shape[1] != 1 or mask.shape[-1] > keys:
        raise ExactAttentionError(f"exact attention takes a (batch, 1, queries, keys<= {keys}) "
                                  f"mask, got shape {tuple(mask.shape)}")
    attend = mask[:, 0] if mask.dtype == torch.bool else mask[:, 0] == 0
    return attend.expand(batch, queries, mask.shape[-1])


def _windows(attend: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each query's first attended key and number of keys ``(B, Q)``; a mask attending other
    than one contiguous range of keys is an `ExactAttentionError`."""
    count = attend.sum(-1)
    start = attend.int().argmax(-1)
    slots = torch.arange(attend.shape[-1], device=attend.device)
    expected = (slots >= start[..., None]) & (slots < (start + count)[..., None])
    if not torch.equal(expected, attend):
        raise ExactAttentionError("exact attention needs every query to attend one contiguous "
                                  "range of keys (causal, sliding-window, packed or left-padded "
                                  "masks); this model's mask attends keys apart from the rest "
                                  "(a sink key before a window, a sparse selection)")
    return start, count


def _attend_window(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   start: torch.Tensor, count: torch.Tensor, width: int,
                   scale: float, sinks: torch.Tensor | None) -> torch.Tensor:
    """``(B, H, Q, Dv)`` fp32 for the queries whose windows are ``start``/``count`` ``(B, Q)``."""
    batch, heads, queries, dim = query.shape
    kv_heads = key.shape[1]
    offsets = torch.arange(width, device=query.device)
    index = (start[..., None] + offsets).clamp(max=key.shape[2] - 1)  # (B, Q, W)
    valid = offsets < count[..., None]
    rows = torch.arange(batch, device=query.device)[:, None, None, None]
    kv = torch.arange(kv_heads, device=query.device)[None, :, None, None]
    keys = key.float()[rows, kv, index[:, None]]  # (B, Hkv, Q, W, D)
    values = torch.where(valid[:, None, :, :, None], value.float()[rows, kv, index[:, None]], 0.0)
    grouped = query.float().reshape(batch, kv_heads, heads // kv_heads, queries, dim)
    scores = tree_sum(grouped[..., None, :] * keys[:, :, None], -1) * scale  # (B, Hkv, G, Q, W)
    scores = torch.where(valid[:, None, None], scores, float("-inf"))
    top = scores.amax(-1, keepdim=True)
    if sinks is not None:  # (H,) -> (1, Hkv, G, 1, 1), as the query heads are grouped
        sink = sinks.float().reshape(1, kv_heads, heads // kv_heads, 1, 1)
        top = torch.maximum(top, sink)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    probs = torch.where(valid[:, None, None], torch.exp(scores - top), 0.0)
    total = tree_sum(probs, -1)
    if sinks is not None:
        total = total + torch.exp(sink - top)[..., 0]
    weighted = tree_sum(probs[..., None] * values[:, :, None], -2)  # (B, Hkv, G, Q, Dv)
    out = weighted / torch.where(total > 0, total, 1.0)[..., None]
    return out.reshape(batch, heads, queries, -1)


def exact_mask(*args: Any, **kwargs: Any) -> torch.Tensor | None:
    """transformers' SDPA mask (boolean, True: attend), never skipped for ``is_causal``."""
    from transformers.masking_utils import sdpa_mask

    kwargs["allow_is_causal_skip"] = False
    return sdpa_mask(*args, **kwargs)


def register_exact_attention() -> None:
    """Register `EXACT_ATTENTION` with transformers' attention and mask registries, and with
    the decode loops as an attention that takes their boolean masks (graft-graphed-decode's;
    idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    from graft.rollout import register_boolean_mask_attention

    AttentionInterface.register(EXACT_ATTENTION, exact_attention_forward)
    AttentionMaskInterface.register(EXACT_ATTENTION, exact_mask)
    register_boolean_mask_attention(EXACT_ATTENTION)
