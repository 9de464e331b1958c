"""The precision map, resolved against the tiny DeepSeek-V4: exact, and failing closed."""

from __future__ import annotations

import pytest
import torch

from graft.config import ModelConfig
from graft.errors import ConfigError, PluginError
from graft.models import build_model
from graft_deepseek_v4.install import expert_dtype
from graft_deepseek_v4.precision import (
    EXPERT_WEIGHTS,
    INDEXER_QK,
    INPUT_ROWS,
    KV_NOPE,
    WEIGHT_TILES,
    resolve_targets,
)

LINEAR = (WEIGHT_TILES, INPUT_ROWS, None, None)
EVERY_LAYER = {
    "self_attn.q_a_proj": LINEAR, "self_attn.q_b_proj": LINEAR, "self_attn.kv_proj": LINEAR,
    "self_attn.kv_norm": (None, None, KV_NOPE, None), "self_attn.o_a_proj": LINEAR,
    "self_attn.o_b_proj": LINEAR, "self_attn.compressor.kv_norm": (None, None, KV_NOPE, None),
    "mlp.experts": (EXPERT_WEIGHTS, INPUT_ROWS, None, INPUT_ROWS),
    "mlp.shared_experts.gate_proj": LINEAR, "mlp.shared_experts.up_proj": LINEAR,
    "mlp.shared_experts.down_proj": LINEAR,
}
SPARSE_LAYER = {"self_attn.compressor.indexer.q_b_proj": LINEAR,
                "self_attn.compressor.indexer.scorer": (None, INDEXER_QK, None, None)}


def tiny(**overrides) -> torch.nn.Module:
    return build_model(ModelConfig(preset="tiny-deepseek-v4", overrides=overrides))[0]


def plan(model: torch.nn.Module, dtype: str = "fp8") -> dict[str, tuple]:
    targets = resolve_targets(model, list(model.model.layers), expert_dtype=dtype)
    return {t.name: (t.rule.weight, t.rule.inputs, t.rule.output, t.rule.inner) for t in targets}


def test_the_map_is_exact_on_the_tiny_model() -> None:
    model = tiny()
    assert model.config.layer_types == ["compressed_sparse_attention",
                                        "heavily_compressed_attention"]
    expected = {f"model.layers.0.{p}": v for p, v in {**EVERY_LAYER, **SPARSE_LAYER}.items()}
    expected |= {f"model.layers.1.{p}": v for p, v in EVERY_LAYER.items()}
    assert plan(model) == expected


def test_the_query_the_gate_and_the_compressors_are_never_quantised() -> None:
    targets = plan(tiny())
    for layer in (0, 1):
        assert targets[f"model.layers.{layer}.self_attn.q_b_proj"][2] is None, "query output"
        for bf16 in ("mlp.gate", "mlp", "self_attn.compressor.kv_proj",
                     "self_attn.compressor.gate_proj", "self_attn.compressor.indexer.kv_proj",
                     "self_attn.compressor.indexer.gate_proj",
                     "self_attn.compressor.indexer.scorer.weights_proj", "attn_hc", "ffn_hc"):
            assert f"model.layers.{layer}.{bf16}" not in targets
    assert "lm_head" not in targets and "model.embed_tokens" not in targets


def test_a_missing_target_fails_closed() -> None:
    model = tiny()
    del model.model.layers[1].self_attn.o_b_proj
    with pytest.raises(PluginError, match=r"'self_attn.o_b_proj' \(wo_b\) does not exist in "
                                          r"model.layers.1 \(DeepseekV4DecoderLayer\)"):
        plan(model)


def test_a_target_of_another_kind_fails_closed() -> None:
    model = tiny()
    model.model.layers[0].mlp.shared_experts.up_proj = torch.nn.Identity()
    with pytest.raises(PluginError, match="shared_experts.up_proj .Identity. is not the linear"):
        plan(model)


def test_a_linear_layer_the_map_does_not_know_fails_closed() -> None:
    model = tiny()
    model.model.layers[0].self_attn.new_proj = torch.nn.Linear(128, 128, bias=False)
    with pytest.raises(PluginError, match=r"model.layers.0.self_attn.new_proj is not in the "
                                          r"precision map"):
        plan(model)


def test_sizes_that_do_not_tile_are_named() -> None:
    with pytest.raises(ConfigError, match=r"model.layers.0.self_attn.q_a_proj \(wq_a\): its "
                                          r"weight rows \(96\) is not a multiple of the 128"):
        plan(tiny(q_lora_rank=96))
    with pytest.raises(ConfigError, match=r"non-RoPE KV channels \(96\).*64-wide"):
        plan(tiny(partial_rotary_factor=0.25))


def test_expert_sizes_are_checked_against_their_tiles() -> None:
    # 160 = 5 groups of 32 (FP4 weights) but the second GEMM's input needs 1x128 tiles
    with pytest.raises(ConfigError, match=r"mlp.experts .*expert intermediate size \(input "
                                          r"activations\) \(160\)"):
        plan(tiny(moe_intermediate_size=160), "fp4")


def test_expert_dtype_comes_from_the_model_config() -> None:
    config = tiny().config
    assert expert_dtype("auto", config) == "fp8"
    config.expert_dtype = "fp4"  # DeepSeek-V4-Flash's config says so
    assert expert_dtype("auto", config) == "fp4"
    assert expert_dtype("fp8", config) == "fp8"
    config.expert_dtype = "int4"
    with pytest.raises(ConfigError, match="expert_dtype is 'int4'"):
        expert_dtype("auto", config)


def test_stacked_experts_are_out_by_in_matrices_as_the_tiles_assume() -> None:
    """`check_tiles`, the 128x128 tiles and the FP4 groups (1x32 along the last dim: the GEMM's
    input dim, as DeepSeek's checkpoints group them) assume transformers keeps expert e's weights
    as ``(out, in)`` matrices: checked on its experts module by what single entries do."""
    model = tiny()
    config = model.config
    experts = model.model.layers[0].mlp.experts
    hidden, inner = config.hidden_size, config.moe_intermediate_size
    assert experts.gate_up_proj.shape == (config.n_routed_experts, 2 * inner, hidden)
    assert experts.down_proj.shape == (config.n_routed_experts, hidden, inner)
    with torch.no_grad():
        experts.gate_up_proj.zero_()
        experts.down_proj.zero_()
        experts.gate_up_proj[3, 5, 7] = 1.0  # gate channel 5 reads input 7
        experts.gate_up_proj[3, inner + 5, 7] = 1.0  # up channel 5 reads input 7
        experts.down_proj[3, 11, 5] = 1.0  # output 11 reads channel 5
        x = torch.zeros(1, hidden)
        x[0, 7] = 2.0
        out = experts(x, torch.tensor([[3]]), torch.tensor([[1.0]]))
    assert out.nonzero().tolist() == [[0, 11]]
    assert out[0, 11] == torch.nn.functional.silu(torch.tensor(2.0)) * 2.0
