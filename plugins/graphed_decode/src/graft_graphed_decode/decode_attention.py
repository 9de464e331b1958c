"""Attention for `graft_graphed_decode.decoder` over a static KV cache, given a ``(batch, 1,
queries, keys)`` boolean mask: the decode steps (one query position per row) and the prefill.

transformers' SDPA path copies every cached key and value once per query head when a mask is
given (grouped-query models). Here the query heads of each key/value head attend as one block of
queries, and only to the first ``keys`` cache slots: the loop passes a mask covering the slots
filled so far (the prompt, at prefill), so the empty end of the cache is not read.
"""

from __future__ import annotations

import torch

from graft.rollout import boolean_mask_attentions

GROUPED_ATTENTION = "graft_grouped_query_decode"
# The attention implementations of this loop's own that take its boolean mask: SDPA is switched
# to `GROUPED_ATTENTION`. Other plugins' attentions join through the core
# (`graft.rollout.register_boolean_mask_attention`) and are kept.
OWN_BOOLEAN_MASK_ATTENTIONS = ("sdpa", GROUPED_ATTENTION)
# A prefill's mask is copied once per query head of a group; above this many elements (bools)
# the prefill takes transformers' path instead (keys and values copied per head).
GROUPED_MASK_ELEMENTS = 1 << 28


def grouped_query_decode_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                                   value: torch.Tensor, attention_mask: torch.Tensor | None,
                                   **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention, except with a boolean ``(batch, 1, queries, keys)`` mask
    (the graphed loop's decode steps and prefill): the query heads of each key/value head attend
    as one block of queries, so no key or value is copied per query head, and only to the first
    ``keys`` cached keys (the mask may cover fewer than the cache holds)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    batch, heads, queries, dim = query.shape
    kv_heads = key.shape[1]
    if (attention_mask is None or attention_mask.dtype != torch.bool
            or attention_mask.shape[1:3] != (1, queries) or kwargs.get("dropout", 0.0)):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    attended = attention_mask.shape[-1]
    key, value = key[:, :, :attended], value[:, :, :attended]
    group = heads // kv_heads
    if queries > 1 and attention_mask.numel() * group > GROUPED_MASK_ELEMENTS:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    # rows of a block: query head j of the group at position i is row j * queries + i
    grouped = query.reshape(batch, kv_heads, group * queries, dim)
    if queries > 1:  # every head of the group needs the mask's rows (one row broadcasts)
        attention_mask = attention_mask[:, :, None].expand(batch, 1, group, queries, attended)
        attention_mask = attention_mask.reshape(batch, 1, group * queries, attended)
    out = torch.nn.functional.scaled_dot_product_attention(
        grouped, key, value, attn_mask=attention_mask, scale=kwargs.get("scaling"))
    return out.reshape(batch, heads, queries, dim).transpose(1, 2).contiguous(), None


def use_grouped_query_attention(model: torch.nn.Module) -> None:
    """Switch ``model`` (SDPA) to `grouped_query_decode_attention` (registered once)."""
    from transformers import AttentionInterface

    AttentionInterface.register(GROUPED_ATTENTION, grouped_query_decode_attention)
    model.set_attn_implementation(GROUPED_ATTENTION)


def takes_boolean_mask(attention: str | None) -> bool:
    """Whether the decode loop hands the attention implementation ``attention`` (transformers'
    name) a boolean ``(batch, 1, queries, keys)`` mask (True: attend) over the first ``keys``
    cache slots: SDPA (switched to `GROUPED_ATTENTION`), that one, and every attention a plugin
    registered with `graft.rollout.register_boolean_mask_attention`."""
    return attention in OWN_BOOLEAN_MASK_ATTENTIONS or attention in boolean_mask_attentions()
