"""Composing the config: schema, plugin sections, overrides, YAML files and their errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from graft.config import compose, to_yaml
from graft.errors import ConfigError
from graft.plugins import GraftPluginManager


@pytest.fixture
def manager(plugin_sites: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
            clean_env: None) -> GraftPluginManager:
    """A manager with the demo plugin loaded (section features.demo) and the broken one failed."""
    monkeypatch.syspath_prepend(str(plugin_sites["good"]))
    loaded = GraftPluginManager()
    loaded.load()
    return loaded


@pytest.fixture
def bare() -> GraftPluginManager:
    """A manager with no plugins."""
    loaded = GraftPluginManager()
    loaded.load(candidates=[])
    return loaded


def test_defaults_compose_to_dataclasses(bare: GraftPluginManager) -> None:
    cfg = compose(manager=bare)
    assert cfg.trainer.mode == "rl"
    assert cfg.engine.pad_to_length_bucket == 1024
    assert type(cfg.trainer).__name__ == "TrainerConfig"


def test_override_sets_typed_values(bare: GraftPluginManager) -> None:
    cfg = compose(["trainer.total_steps=3", "optim.lr=0.5", "optim.betas=[0.8,0.9]",
                   "model.path=null"], manager=bare)
    assert cfg.trainer.total_steps == 3 and cfg.optim.lr == 0.5
    assert cfg.optim.betas == [0.8, 0.9]


@pytest.mark.parametrize("override", ["trainer.totl_steps=3", "+trainer.totl_steps=3",
                                      "++trainer.totl_steps=3"])
def test_misspelled_key_names_key_section_and_suggestion(bare: GraftPluginManager,
                                                         override: str) -> None:
    with pytest.raises(ConfigError) as info:
        compose([override], manager=bare)
    message = str(info.value)
    assert "'trainer.totl_steps'" in message and "trainer has no key 'totl_steps'" in message
    assert "Did you mean 'total_steps'?" in message


def test_unknown_top_level_section(bare: GraftPluginManager) -> None:
    with pytest.raises(ConfigError, match="the root config has no key 'trainr'.*Did you mean 'trainer'"):
        compose(["trainr.total_steps=3"], manager=bare)


def test_key_existing_in_another_section_is_pointed_out(bare: GraftPluginManager) -> None:
    with pytest.raises(ConfigError, match="A key 'bucket_mb' exists at: export.bucket_mb"):
        compose(["trainer.bucket_mb=3"], manager=bare)


def test_keys_below_a_value_are_unknown(bare: GraftPluginManager) -> None:
    with pytest.raises(ConfigError, match="trainer.seed is a value, not a section"):
        compose(["trainer.seed.x=3"], manager=bare)


def test_open_mapping_accepts_new_keys_and_deletion(bare: GraftPluginManager) -> None:
    cfg = compose(["+model.overrides.num_hidden_layers=2", "model.overrides.vocab_size=500",
                   "~model.overrides.vocab_size"], manager=bare)
    assert cfg.model.overrides == {"num_hidden_layers": 2}


def test_deleting_a_schema_key_is_an_error(bare: GraftPluginManager) -> None:
    with pytest.raises(ConfigError, match="cannot delete 'trainer.seed'"):
        compose(["~trainer.seed"], manager=bare)


def test_wrong_type_names_key_expected_type_and_value(bare: GraftPluginManager) -> None:
    with pytest.raises(ConfigError) as info:
        compose(["trainer.total_steps=abc"], manager=bare)
    assert "'trainer.total_steps'" in str(info.value)
    assert "expects int, got 'abc' (str)" in str(info.value)
    with pytest.raises(ConfigError, match=r"'loss.clip_ratio_c' .* expects float or null, got"):
        compose(["loss.clip_ratio_c=abc"], manager=bare)


def test_value_outside_choices_lists_valid_values(bare: GraftPluginManager) -> None:
    with pytest.raises(ConfigError, match="'trainer.mode' is 'ppo'. Valid values: rl, sft."):
        compose(["trainer.mode=ppo"], manager=bare)


def test_sweeps_and_malformed_overrides_are_errors(bare: GraftPluginManager) -> None:
    with pytest.raises(ConfigError, match="is a sweep"):
        compose(["trainer.seed=1,2"], manager=bare)
    with pytest.raises(ConfigError, match="cannot parse the override 'trainer.seed'"):
        compose(["trainer.seed"], manager=bare)


def test_hook_graft_config_sections_merges_plugin_section(manager: GraftPluginManager) -> None:
    cfg = compose(["features.demo.scale=2.5"], manager=manager)
    assert cfg.features.demo.greeting == "hello"
    assert cfg.features.demo.scale == 2.5
    assert "\n  demo:\n    greeting: hello\n    scale: 2.5\n" in to_yaml(cfg).split("features:")[1]


def test_plugin_section_keys_are_checked(manager: GraftPluginManager) -> None:
    with pytest.raises(ConfigError, match="features.demo has no key 'greting'.*Did you mean 'greeting'"):
        compose(["+features.demo.greting=hi"], manager=manager)
    with pytest.raises(ConfigError, match="features.demo.scale.*expects float"):
        compose(["features.demo.scale=big"], manager=manager)


def test_section_of_a_disabled_plugin_is_explained(plugin_sites: dict[str, Path],
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    clean_env: None) -> None:
    monkeypatch.syspath_prepend(str(plugin_sites["good"]))
    manager = GraftPluginManager()
    manager.load(disabled=["demo"])
    with pytest.raises(ConfigError) as info:
        compose(["features.demo.scale=2"], manager=manager)
    assert "features has no key 'demo'" in str(info.value)
    assert "demo (disabled)" in str(info.value) and "broken (failed)" in str(info.value)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


def test_yaml_file_is_merged(tmp_path: Path, manager: GraftPluginManager) -> None:
    path = write(tmp_path, "trainer:\n  total_steps: 7\nfeatures:\n  demo:\n    tags: [a, b]\n")
    cfg = compose(["trainer.seed=4"], [path], manager=manager)
    assert (cfg.trainer.total_steps, cfg.trainer.seed) == (7, 4)
    assert cfg.features.demo.tags == ["a", "b"]


def test_yaml_unknown_key_names_file_line_and_suggestion(tmp_path: Path,
                                                         bare: GraftPluginManager) -> None:
    path = write(tmp_path, "trainer:\n  seed: 1\n  totl_steps: 7\n")
    with pytest.raises(ConfigError) as info:
        compose(config_files=[path], manager=bare)
    message = str(info.value)
    assert f"{path}, line 3" in message and "'trainer.totl_steps'" in message
    assert "Did you mean 'total_steps'?" in message


def test_yaml_wrong_type_names_key_and_file(tmp_path: Path, bare: GraftPluginManager) -> None:
    path = write(tmp_path, "trainer:\n  total_steps: many\n")
    with pytest.raises(ConfigError) as info:
        compose(config_files=[path], manager=bare)
    assert "'trainer.total_steps'" in str(info.value) and str(path) in str(info.value)
    assert "expects int" in str(info.value) and "'many'" in str(info.value)


def test_yaml_scalar_for_a_section_is_an_error(tmp_path: Path, bare: GraftPluginManager) -> None:
    path = write(tmp_path, "trainer: 3\n")
    with pytest.raises(ConfigError, match="'trainer'.*is a section; give a mapping"):
        compose(config_files=[path], manager=bare)


def test_plugin_preset_is_found_by_name(manager: GraftPluginManager) -> None:
    cfg = compose(config_files=["demo-greeting"], manager=manager)
    assert cfg.features.demo.greeting == "bonjour" and cfg.trainer.total_steps == 2


def test_unknown_preset_lists_presets(manager: GraftPluginManager) -> None:
    with pytest.raises(ConfigError, match="'demo-greting' is neither.*Did you mean 'demo-greeting'"):
        compose(config_files=["demo-greting"], manager=manager)
