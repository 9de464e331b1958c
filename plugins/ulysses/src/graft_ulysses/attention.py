"""Ulysses attention, registered in transformers' attention-function registry.

`install` gives a model the attention implementation ``ulysses_<original>`` (``ulysses_sdpa``,
``ulysses_eager``, ``ulysses_flash_attention_2``...). Outside the engine's split forward
(`graft.engine.active_shard` is None: the rollout's generation, a plain forward) it is the
original function with the original mask, unchanged. Inside it:

1. K/V heads are repeated up to ``sp`` when the model has fewer KV heads than ``sp`` ranks
   (GQA), so every rank gets whole KV heads for its query heads;
2. Q, K, V go from sequence shards to head shards (`seq_to_heads`): ``H / sp`` heads of the
   whole rows;
3. the original function runs on the whole rows with the whole rows' mask, built once per
   forward from the global position ids (a packed row's samples and its pad stay apart):
   a boolean mask for ``sdpa`` (none, causal, when no row holds two samples), an additive one
   for ``eager``, ``cu_seqlens`` for flash attention;
4. the output goes back to sequence shards (`heads_to_seq`).

The model builds no mask of its own in a split forward (the registered mask function gives
None there): the local positions would describe the wrong rows.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch

from graft.engine import SequenceShard, active_shard
from graft_ulysses.all_to_all import heads_to_seq, seq_to_heads

PREFIX = "ulysses_"
# Original implementations whose masks this module can build for whole rows.
SERVED = ("sdpa", "eager", "flash_attention_2", "flash_attention_3")


def ulysses_name(original: str) -> str:
    """The registered name of Ulysses around ``original``."""
    return f"{PREFIX}{original}"


def install(model: torch.nn.Module) -> str:
    """Switch ``model`` (its config and sub-configs) to Ulysses around its current attention
    implementation; returns the original's name. Idempotent."""
    current = model.config._attn_implementation or "eager"
    original = current.removeprefix(PREFIX)
    register(original)
    model.config._attn_implementation = ulysses_name(original)
    return original


def uninstall(model: torch.nn.Module) -> None:
    """Give ``model`` back the implementation Ulysses wraps (nothing to do when it has none)."""
    current = model.config._attn_implementation
    if current and current.startswith(PREFIX):
        model.config._attn_implementation = current.removeprefix(PREFIX)


def register(original: str) -> None:
    """Register ``ulysses_<original>`` with transformers' attention and mask registries."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface

    name = ulysses_name(original)
    if name in AttentionInterface._global_mapping:
        return
    AttentionInterface.register(name, _attention(original))
    AttentionMaskInterface.register(name, _mask(ALL_MASK_ATTENTION_FUNCTIONS[original]))


def _mask(original_mask: Callable[..., Any]) -> Callable[..., Any]:
    def mask(*args: Any, **kwargs: Any) -> Any:
        if _split() is not None:
            return None  # the attention builds the whole rows' mask itself
        return original_mask(*args, **kwargs)

    return mask


def _split() -> SequenceShard | None:
    shard = active_shard()
    return shard if shard is not None and shard.split else None


def original_function(module: torch.nn.Module, original: str) -> Callable[..., Any]:
    """The function ``original`` names for ``module``: the registry's, or for ``eager`` the
    module's own modeling file's ``eager_attention_forward``."""
    if original == "eager":
        return sys.modules[type(module).__module__].eager_attention_forward
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ALL_ATTENTION_FUNCTIONS[original]


def _attention(original: str) -> Callable[..., Any]:
    def attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                  value: torch.Tensor, attention_mask: Any, **kwargs: Any) -> tuple[Any, Any]:
        inner = original_function(module, original)
        shard = _split()
        if shard is None:
            return inner(module, query, key, value, attention_mask, **kwargs)
        return ulysses_attention(inner, original, shard, module, query, key, value, **kwargs)

    attention.__name__ = ulysses_name(original)
    return attention


def ulysses_attention(inner: Callable[..., Any], original: str, shard: SequenceShard,
                      module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                      value: torch.Tensor, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """``inner`` over whole rows for this rank's ``H / sp`` heads; inputs and output are this
    rank's sequence shard, ``(B, H, S / sp, D)`` in and ``(B, S / sp, H, D)`` out."""
    group, size = shard.group, shard.size
    key, value = replicate_kv_heads(key, size), replicate_kv_heads(value, size)
    q, k, v = (seq_to_heads(t, group) for t in (query, key, value))
    local = _LocalHeads(module, q.shape[1] // k.shape[1])
    mask, extra = whole_rows_inputs(shard, original, q)
    kwargs = {**kwargs, **extra, "position_ids": shard.position_ids}
    out, _ = inner(local, q, k, v, mask, **kwargs)  # (B, S, H / sp, D)
    return heads_to_seq(out.transpose(1, 2), group).transpose(1, 2), None


def replicate_kv_heads(states: torch.Tensor, sp: int) -> torch.Tensor:
    """K or V ``(B, kv, S, D)`` with each head repeated ``sp / kv`` times when ``kv < sp``
    (``sp`` a multiple of ``kv``: checked at install), so each rank gets one whole KV head
    serving its query heads; unchanged when ``kv`` is a multiple of ``sp``."""
    heads = states.shape[1]
    if heads % sp == 0:
        return states
    return states.repeat_interleave(sp // heads, dim=1)


class _LocalHeads:
    """The attention module as the inner function sees it: this rank's heads per KV head."""

    def __init__(self, module: torch.nn.Module, groups: int) -> None:
        self._module = module
        self.num_key_value_groups = groups

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


def segment_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """``(R, L)`` index of the packed segment of every token: a new one starts wherever the
    position does not follow the previous one (transformers' rule for packed rows)."""
    starts = torch.ones_like(position_ids, dtype=torch.bool)
    starts[:, 1:] = position_ids[:, 1:] != position_ids[:, :-1] + 1
    return starts.long().cumsum(dim=1)


def whole_rows_inputs(shard: SequenceShard, original: str,
                      query: torch.Tensor) -> tuple[torch.Tensor | None, dict[str, Any]]:
    """The mask (or flash attention's ``cu_seqlens`` keywords) for whole rows, built once per
    forward and kept in ``shard.cache``."""
    key = (original, query.dtype, query.device)
    if key not in shard.cache:
        shard.cache[key] = _build(shard.position_ids.to(query.device), original, query.dtype,
                                  causal_only=shard.one_sample_per_row)
    return shard.cache[key]


def _build(position_ids: torch.Tensor, original: str, dtype: torch.dtype, *,
           causal_only: bool) -> tuple[torch.Tensor | None, dict[str, Any]]:
    segments = segment_ids(position_ids)
    if original.startswith("flash"):
        return None, flash_keywords(segments)
    if causal_only and original == "sdpa":
        # One sample per row: SDPA's causal kernel, no (L x L) mask (the pad after the sample
        # sees it, which changes only pad outputs, never read).
        return None, {"is_causal": True}
    length = position_ids.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=position_ids.device).tril()
    allowed = (segments[:, :, None] == segments[:, None, :]) & causal
    allowed = allowed[:, None]  # (R, 1, L, L)
    if original == "sdpa":
        return allowed, {}
    blocked = torch.zeros(allowed.shape, dtype=dtype, device=position_ids.device)
    return blocked.masked_fill(~allowed, torch.finfo(dtype).min), {}


def flash_keywords(segments: torch.Tensor) -> dict[str, Any]:
    """Varlen flash attention's keywords for the rows' segments (rows flattened in order)."""
    flat = (segments + torch.arange(segments.shape[0], device=segments.device)[:, None]
            * (int(segments.max()) + 1)).reshape(-1)
    _, counts = torch.unique_consecutive(flat, return_counts=True)
    cu = torch.zeros(counts.numel() + 1, dtype=torch.int32, device=segments.device)
    cu[1:] = counts.cumsum(0)
    longest = int(counts.max())
    return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest,
            "max_length_k": longest}
