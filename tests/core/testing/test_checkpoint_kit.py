"""graft.testing.checkpoint: the conformance kit's real-checkpoint leg, checked with the core
and the meta-blind test plugin (tests/plugins/graft_meta_blind_plugin), whose pre-shard acts
only on real weights: the kit must pass a plugin that works on both paths and fail one that
silently does nothing on ``model.path``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from graft.config import ModelConfig
from graft.models import build_model
from graft.testing.checkpoint import check_plugin_on_checkpoint, save_tiny_checkpoint

SFT = ["trainer.mode=sft"]  # deterministic and the quickest run that trains


def meta_blind_only(plugin_sites: dict[str, Path]) -> dict[str, str]:
    """The runs' environment: the test plugin installed and the only plugin loaded, whichever
    plugins this checkout has (none under ``GRAFT_PLUGINS=``)."""
    return {"PYTHONPATH": str(plugin_sites["meta_blind"]), "GRAFT_PLUGINS": "meta_blind"}


def test_the_saved_checkpoint_holds_the_presets_seeded_weights(tmp_path: Path) -> None:
    folder = save_tiny_checkpoint("tiny-qwen3-moe", tmp_path / "hf", seed=3)
    assert (folder / "tokenizer.json").exists() and (folder / "model.safetensors").exists()
    preset, _ = build_model(ModelConfig(preset="tiny-qwen3-moe"), seed=3)
    loaded, _ = build_model(ModelConfig(path=str(folder)))
    for (name, a), (_, b) in zip(preset.state_dict().items(), loaded.state_dict().items(),
                                 strict=True):
        assert torch.equal(a, b), name


@pytest.mark.slow
def test_a_plugin_that_works_on_meta_weights_passes_on_two_ranks(
        plugin_sites: dict[str, Path], tmp_path: Path) -> None:
    from_path, from_preset = check_plugin_on_checkpoint(
        preset="tiny-llama", overrides=[*SFT, "features.meta_blind.mode=count"],
        expect_metrics=["meta_blind/parameters", "loss"], nproc=2, tmp_path=tmp_path, steps=2,
        env=meta_blind_only(plugin_sites))
    count = sum(p.numel() for p in build_model(ModelConfig(preset="tiny-llama"))[0].parameters())
    assert {row["meta_blind/parameters"] for row in from_path + from_preset} == {count}


@pytest.mark.slow
def test_a_plugin_that_reports_nothing_on_a_checkpoint_fails(plugin_sites: dict[str, Path],
                                                             tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match=r"model.path: step 1 does not report "
                                             r"\['meta_blind/applied'\]"):
        check_plugin_on_checkpoint(
            preset="tiny-llama", overrides=[*SFT, "features.meta_blind.mode=scale"],
            expect_metrics=["meta_blind/applied"], nproc=1, tmp_path=tmp_path, steps=2,
            env=meta_blind_only(plugin_sites))


@pytest.mark.slow
def test_a_plugin_whose_effect_is_lost_on_a_checkpoint_fails(plugin_sites: dict[str, Path],
                                                             tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match=r"step 1: loss is \S+ from model.path but \S+ "
                                             r"from model.preset"):
        check_plugin_on_checkpoint(
            preset="tiny-llama", overrides=[*SFT, "features.meta_blind.mode=scale_always_report"],
            expect_metrics=["meta_blind/applied"], nproc=1, tmp_path=tmp_path, steps=2,
            env=meta_blind_only(plugin_sites))
