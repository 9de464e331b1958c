"""Model families and presets: real transformers models, local directories, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from graft.config import ModelConfig
from graft.errors import ConfigError
from graft.models import build_model, family_for
from graft.testing.families import check_family_preset

PRESETS = {"tiny-llama": "llama", "tiny-qwen3-moe": "qwen3_moe", "tiny-deepseek-v3": "deepseek_v3"}


@pytest.mark.parametrize(("preset", "model_type"), PRESETS.items())
def test_presets_build_tiny_seeded_models(preset: str, model_type: str) -> None:
    model, family = build_model(ModelConfig(preset=preset), seed=3)
    again, _ = build_model(ModelConfig(preset=preset), seed=3)
    assert model.config.model_type == family.model_type == model_type
    assert model.config.hidden_size == 64 and model.config.num_hidden_layers == 2
    assert len(family.decoder_blocks(model)) == 2
    for (name, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


@pytest.mark.parametrize(("preset", "routers"), [("tiny-llama", None), ("tiny-qwen3-moe", 2),
                                                 ("tiny-deepseek-v3", 1)])
def test_core_presets_pass_the_family_conformance_check(preset: str, routers: int | None) -> None:
    check_family_preset(preset, num_routers=routers)
    assert family_for("llama").router_modules is None


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



def test_family_prepare_model_runs_on_every_build(graft_plugin, tmp_path: Path) -> None:
    """Presets, local checkpoints (full and empty-parameter builds) all pass through it."""
    import dataclasses

    from graft import hookimpl
    from graft.models.build import build_empty_model
    from graft.models.builtin import BUILTIN_FAMILIES

    prepared = []
    llama = next(f for f in BUILTIN_FAMILIES if f.model_type == "llama")

    class Marking:
        @hookimpl
        def graft_model_families(self):
            return [dataclasses.replace(llama, prepare_model=lambda m: prepared.append(m))]

    graft_plugin(Marking(), name="marking")
    model, _ = build_model(ModelConfig(preset="tiny-llama"))
    model.save_pretrained(tmp_path)
    from_path, _ = build_model(ModelConfig(path=str(tmp_path)))
    empty, _ = build_empty_model(ModelConfig(path=str(tmp_path)))
    assert prepared == [model, from_path, empty]
