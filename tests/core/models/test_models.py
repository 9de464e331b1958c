"""Model families and presets: real transformers models, local directories, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from graft.config import ModelConfig
from graft.errors import ConfigError
from graft.models import build_model, family_for

PRESETS = {"tiny-llama": "llama", "tiny-qwen3-moe": "qwen3_moe", "tiny-gpt-oss": "gpt_oss",
           "tiny-deepseek-v3": "deepseek_v3", "tiny-deepseek-v4": "deepseek_v4"}


@pytest.mark.parametrize(("preset", "model_type"), PRESETS.items())
def test_presets_build_tiny_seeded_models(preset: str, model_type: str) -> None:
    model, family = build_model(ModelConfig(preset=preset), seed=3)
    again, _ = build_model(ModelConfig(preset=preset), seed=3)
    assert model.config.model_type == family.model_type == model_type
    assert model.config.hidden_size == 64 and model.config.num_hidden_layers == 2
    assert len(family.decoder_blocks(model)) == 2
    for (name, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


def test_moe_families_list_one_router_per_moe_layer() -> None:
    for preset, expected in [("tiny-qwen3-moe", 2), ("tiny-gpt-oss", 2), ("tiny-deepseek-v3", 1),
                             ("tiny-deepseek-v4", 2)]:
        model, family = build_model(ModelConfig(preset=preset))
        assert len(family.router_modules(model)) == expected, preset
    assert family_for("llama").router_modules is None


def test_deepseek_v4_hash_routing_table_is_initialised() -> None:
    model, _ = build_model(ModelConfig(preset="tiny-deepseek-v4"), seed=0)
    tables = [m.tid2eid for m in model.modules() if hasattr(m, "tid2eid")]
    assert tables, "the preset has a hash-routed layer"
    for table in tables:
        assert table.max() > 0, "transformers leaves the table at zeros: every token -> expert 0"
        assert all(len(set(row.tolist())) == row.numel() for row in table), "distinct experts"
        assert len(set(table[:, 0].tolist())) == model.config.n_routed_experts


def test_local_directory_loads_offline(tmp_path: Path) -> None:
    model, _ = build_model(ModelConfig(preset="tiny-llama"), seed=1)
    model.save_pretrained(tmp_path)
    loaded, family = build_model(ModelConfig(path=str(tmp_path)))
    assert family.model_type == "llama"
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items(),
                                 strict=True):
        assert torch.equal(a, b), name


def test_config_overrides_apply_and_unknown_fields_are_errors() -> None:
    model, _ = build_model(ModelConfig(preset="tiny-llama", overrides={"num_hidden_layers": 1}))
    assert model.config.num_hidden_layers == 1
    wide, _ = build_model(ModelConfig(preset="tiny-llama", overrides={"intermediate_size": 96}))
    assert wide.model.layers[0].mlp.gate_proj.weight.shape == (96, 64)
    with pytest.raises(ConfigError, match="model.overrides.num_layers.*Did you mean 'num_hidden_layers'"):
        build_model(ModelConfig(preset="tiny-llama", overrides={"num_layers": 1}))


@pytest.mark.parametrize(("path", "message"), [
    ("meta-llama/Llama-3.2-1B", "never downloads"),
    ("/no/such/dir", "does not exist"),
])
def test_bad_model_path(path: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_model(ModelConfig(path=path))


@pytest.mark.parametrize("preset", ["tiny-qwen3-moe", "tiny-deepseek-v3"])
def test_routing_weights_reproduce_the_routers_own(preset: str) -> None:
    """Given the experts a router chose, the family recomputes exactly its weights (what routing
    replay relies on to keep gradients flowing to the router)."""
    model, family = build_model(ModelConfig(preset=preset))
    torch.manual_seed(1)
    for router in family.router_modules(model):
        with torch.no_grad():
            router.weight.normal_()
        logits, weights, ids = router(torch.randn(7, model.config.hidden_size))
        assert torch.equal(family.routing_weights(router, logits, ids), weights)
