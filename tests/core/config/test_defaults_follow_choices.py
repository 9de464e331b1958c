"""A default never conflicts with another setting: only a value the user set can break a rule.

``loss.policy_loss=gspo`` with the default ``loss.clip_ratio_c`` (issue 36, finding 13) and
``rollout.engine=vllm`` with the default ``rollout.max_model_len`` above the model's
``max_position_embeddings`` (finding 11, checked when the config is composed, before vLLM starts).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from graft.config import compose
from graft.errors import ConfigError
from graft.plugins import GraftPluginManager


@pytest.fixture
def bare() -> GraftPluginManager:
    """A manager with no plugins."""
    loaded = GraftPluginManager()
    loaded.load(candidates=[])
    return loaded


def test_gspo_alone_turns_the_default_dual_clip_off(bare: GraftPluginManager) -> None:
    cfg = compose(["loss.policy_loss=gspo"], manager=bare)
    assert cfg.loss.clip_ratio_c is None
    assert compose(manager=bare).loss.clip_ratio_c == 3.0  # PPO keeps its dual clip


def test_gspo_from_a_yaml_file_turns_the_default_off(bare: GraftPluginManager,
                                                     tmp_path: Path) -> None:
    config = tmp_path / "gspo.yaml"
    config.write_text("loss:\n  policy_loss: gspo\n")
    assert compose(config_files=[config], manager=bare).loss.clip_ratio_c is None


@pytest.mark.parametrize("where", ["override", "yaml"])
def test_gspo_with_a_dual_clip_the_user_set_is_an_error(bare: GraftPluginManager, tmp_path: Path,
                                                        where: str) -> None:
    config = tmp_path / "gspo.yaml"
    config.write_text("loss:\n  clip_ratio_c: 3.0\n")
    overrides = ["loss.policy_loss=gspo"]
    files = [config] if where == "yaml" else []
    if where == "override":
        overrides.append("loss.clip_ratio_c=3.0")  # the default's own value, set on purpose
    with pytest.raises(ConfigError, match=r"clip_ratio_c=3.0 would be ignored.*clip_ratio_c=null"):
        compose(overrides, config_files=files, manager=bare)


def test_graft_config_show_gspo_works(run_graft) -> None:
    shown = run_graft(["config", "show", "loss.policy_loss=gspo"])
    assert shown.returncode == 0, shown.stderr
    assert "clip_ratio_c: null" in shown.stdout
    refused = run_graft(["config", "show", "loss.policy_loss=gspo", "loss.clip_ratio_c=2.0"])
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "loss.clip_ratio_c=null" in refused.stderr


def local_model_config(folder: Path, max_position_embeddings: int) -> Path:
    """A local model directory's config.json (a tiny Llama): all composing reads."""
    from transformers import LlamaConfig

    LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1,
                max_position_embeddings=max_position_embeddings).save_pretrained(folder)
    return folder


def test_vllm_context_above_the_model_is_an_error_naming_both(run_graft, tmp_path: Path) -> None:
    model = local_model_config(tmp_path / "model", 256)
    done = run_graft(["train", f"model.path={model}", "rollout.engine=vllm",
                      "rollout.max_model_len=4096", f"trainer.run_dir={tmp_path / 'run'}"],
                     timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert "rollout.max_model_len=4096" in done.stderr
    assert "max_position_embeddings=256" in done.stderr
    assert "set rollout.max_model_len=256 or lower" in done.stderr
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_vllm_default_context_is_lowered_to_the_model(bare: GraftPluginManager,
                                                      tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="graft.config")
    model = local_model_config(tmp_path / "model", 256)
    cfg = compose([f"model.path={model}", "rollout.engine=vllm"], manager=bare)
    assert cfg.rollout.max_model_len == 256
    assert "using 256" in caplog.text
    fits = compose([f"model.path={model}", "rollout.engine=vllm", "rollout.max_model_len=200"],
                   manager=bare)
    assert fits.rollout.max_model_len == 200
    preset = compose(["rollout.engine=vllm", "model.overrides.max_position_embeddings=512"],
                     manager=bare)
    assert preset.rollout.max_model_len == 512
    with pytest.raises(ConfigError, match="max_position_embeddings=512"):
        compose(["rollout.engine=vllm", "model.overrides.max_position_embeddings=512",
                 "rollout.max_model_len=1024"], manager=bare)


def test_config_yaml_of_a_gspo_run_composes_again(bare: GraftPluginManager,
                                                  tmp_path: Path) -> None:
    """A run's saved config (every key written out) composes as it was: ``graft export`` and
    ``--config runs/X/config.yaml`` read it."""
    from graft.config import to_yaml

    saved = tmp_path / "config.yaml"
    saved.write_text(to_yaml(compose(["loss.policy_loss=gspo"], manager=bare)))
    again = compose(config_files=[saved], manager=bare)
    assert again.loss.policy_loss == "gspo" and again.loss.clip_ratio_c is None
    assert json.dumps(again.loss.__dict__) == json.dumps(
        compose(["loss.policy_loss=gspo"], manager=bare).loss.__dict__)


def test_the_vllm_rollout_checks_the_context_before_it_exports(tmp_path: Path) -> None:
    """A config built in Python skips composing's check; the engine refuses it before it writes
    the weights for vLLM (vLLM itself refused with a pydantic traceback 20 s later)."""
    import torch

    from graft.config import ModelConfig
    from graft.models import build_model
    from graft.rollout.vllm import VLLMRollout

    limit = {"max_position_embeddings": 256}
    model, _ = build_model(ModelConfig(preset="tiny-llama", overrides=limit))
    cfg = compose(["rollout.engine=vllm", "model.overrides.max_position_embeddings=256"])
    cfg.rollout.max_model_len = 4096
    with pytest.raises(ConfigError, match=r"rollout.max_model_len=4096 .*"
                                          r"max_position_embeddings=256"):
        VLLMRollout(model, compute_dtype=torch.float32, cfg=cfg, env=None, run_dir=tmp_path,
                    tokenizer=None)
    assert not (tmp_path / "rollout_init").exists()
