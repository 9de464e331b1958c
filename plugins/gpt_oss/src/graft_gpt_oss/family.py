"""The ``gpt_oss`` `graft.models.ModelFamily`: preset, packed per-layer-type masks, routers and
their weights (routing replay), expert-parallel ``parallelize``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from graft.models import ModelFamily, preset_config, routers_at

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig


def tiny_gpt_oss(**overrides: Any) -> PretrainedConfig:
    """GPT-OSS: 8 experts, top-2, alternating sliding (window 64) and full attention, sinks."""
    return preset_config("gpt_oss", overrides, intermediate_size=64, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=32, num_local_experts=8,
                         num_experts_per_tok=2, sliding_window=64, max_position_embeddings=131072)


def packed_masks(config: PretrainedConfig, position_ids: torch.Tensor,
                 dtype: torch.dtype) -> dict[str, Any]:
    """Per-layer-type masks for a packed row: GPT-OSS's own mask code ignores ``position_ids``."""
    import torch
    from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

    embeds = torch.empty((*position_ids.shape, 1), dtype=dtype, device=position_ids.device)
    return {layer_type: make(config, embeds, attention_mask=None, position_ids=position_ids,
                             **{mask_cache_keyword(make): None})
            for layer_type, make in (("full_attention", create_causal_mask),
                                     ("sliding_attention", create_sliding_window_causal_mask))}


def mask_cache_keyword(mask_function: Any) -> str:
    """The name ``mask_function`` (transformers' ``create_*_mask``) takes the KV cache by:
    ``past_key_values`` through transformers 5.23, ``cache`` from 5.24 (which still accepts the
    old name, deprecated, until 5.40)."""
    import inspect

    return "cache" if "cache" in inspect.signature(mask_function).parameters else "past_key_values"


def routing_weights(router: torch.nn.Module, logits: torch.Tensor,
                    ids: torch.Tensor) -> torch.Tensor:
    """GPT-OSS: a softmax over the chosen experts' logits (the router's bias included): the
    routing-replay adapter (graft-router-replay imposes ``ids`` and recomputes the weights with
    it, so gradients still reach the router's weight and bias)."""
    import torch

    return torch.softmax(logits.gather(1, ids), dim=1, dtype=logits.dtype)


def gpt_oss_family() -> ModelFamily:
    """The family Graft uses for ``model_type == "gpt_oss"`` (``engine.ep_size > 1`` allowed)."""
    from graft_gpt_oss.parallel import parallelize_gpt_oss

    return ModelFamily("gpt_oss", presets={"tiny-gpt-oss": tiny_gpt_oss},
                       packed_attention_mask=packed_masks, router_modules=routers_at("router"),
                       routing_weights=routing_weights, parallelize=parallelize_gpt_oss,
                       expert_parallel=True)
