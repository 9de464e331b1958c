"""The ``deepseek_v4`` `graft.models.ModelFamily`: preset, seeded hash table, tie-stable indexer,
no packing, routers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from graft.models import ModelFamily, preset_config, routers_at

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig


def tiny_deepseek_v4(**overrides: Any) -> PretrainedConfig:
    """DeepSeek-V4: one hash-routed and one learned-router MoE layer, CSA and HCA attention.

    Every quantised size is a multiple of the QAT tiles (128; 64 non-RoPE KV channels), so
    ``features.deepseek_v4.qat`` runs on it; 2 index heads make tied indexer scores common.
    """
    return preset_config("deepseek_v4", overrides, hidden_size=128, moe_intermediate_size=128,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=128,
                         q_lora_rank=128, n_routed_experts=8, num_experts_per_tok=2, o_groups=2,
                         o_lora_rank=128, index_n_heads=2, index_head_dim=128, index_topk=4,
                         sliding_window=16, hc_mult=2, partial_rotary_factor=0.5,
                         max_position_embeddings=4096,
                         layer_types=["compressed_sparse_attention",
                                      "heavily_compressed_attention"],
                         mlp_layer_types=["hash_moe", "moe"],
                         compress_rates={"compressed_sparse_attention": 4,
                                         "heavily_compressed_attention": 8})


def seeded_hash_table(model: torch.nn.Module, seed: int) -> None:
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
        # a random permutation of the experts per token (argsort of uniform draws), cut to top_k
        draws = torch.rand((vocab, model.config.n_routed_experts), generator=generator)
        table.copy_(draws.argsort(dim=-1)[:, :top_k].to(table.dtype))


def prepare_model(model: torch.nn.Module) -> None:
    """Every DeepSeek-V4 model Graft builds: the tie-stable indexer top-k
    (`graft_deepseek_v4.indexer`)."""
    from graft_deepseek_v4.indexer import install_stable_indexer_topk

    install_stable_indexer_topk(model)


def routing_weights(router: torch.nn.Module, logits: torch.Tensor,
                    ids: torch.Tensor) -> torch.Tensor:
    """DeepSeek-V4 (learned and hash routers alike): the chosen experts' scores
    (``scoring_func`` of the logits), renormalised, times ``routed_scaling_factor``."""
    weights = router.score_fn(logits).gather(1, ids)
    return weights / (weights.sum(dim=-1, keepdim=True) + 1e-20) * router.routed_scaling_factor


def is_hash_router(router: torch.nn.Module) -> bool:
    """True for a hash-routed layer's router: its experts come from ``tid2eid[token id]``."""
    return hasattr(router, "tid2eid")


def deepseek_v4_family() -> ModelFamily:
    """The family Graft uses for ``model_type == "deepseek_v4"``; its compressed attention mixes
    positions across packed samples, so every sample gets its own row, and its compressor and
    indexer ignore the attention mask, so prompts of one length generate together."""
    return ModelFamily("deepseek_v4", presets={"tiny-deepseek-v4": tiny_deepseek_v4},
                       packs_sequences=False, left_padding_exact=False,
                       init_weights=seeded_hash_table,
                       prepare_model=prepare_model,
                       router_modules=routers_at("gate"), routing_weights=routing_weights,
                       static_routing=is_hash_router,
                       # graft-exact's reason to refuse the family (features.exact.enabled)
                       extras={"exact": {"unsupported": "its compressed attention and sparse "
                                                        "indexer (top-k key selection) have no "
                                                        "exact kernel yet"}})
