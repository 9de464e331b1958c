"""graft-multiturn as installed: graft.testing's conformance check, its section, the old
``rollout.*`` keys naming their new home, a saved config of an earlier version still composing,
and the runner only where an environment is chosen."""

from __future__ import annotations

from pathlib import Path

import pytest
from graft_multiturn import EpisodeRunner, MultiturnConfig, build_episode_runner

import graft
from graft.data.tokenizer import builtin_tokenizer
from graft.errors import ConfigError
from graft.rollout import EpisodeRunner as RunnerProtocol
from graft.testing import check_config_section, check_installed_plugin, check_moved_key

OLD_KEYS = [("environment", "calculator", "none"), ("max_turns", "2", 4),
            ("max_episode_tokens", "16", 256), ("env_timeout_s", "1.5", 10.0),
            ("max_failed_env_steps", "0", 3)]


def test_the_installed_plugin_passes_graft_testing() -> None:
    assert set(check_installed_plugin("multiturn")) == {
        "graft_config_sections", "graft_episode_runner"}
    assert check_config_section("multiturn", MultiturnConfig) == {
        "environment": "none", "max_turns": 4, "max_episode_tokens": 256, "env_timeout_s": 10.0,
        "max_failed_env_steps": 3, "on_prefix_break": "keep"}


@pytest.mark.parametrize("old, value, default", OLD_KEYS)
def test_an_old_rollout_key_names_its_new_home(old: str, value: str, default: object,
                                               tmp_path: Path) -> None:
    check_moved_key(f"rollout.{old}", f"features.multiturn.{old}", value, tmp_path)
    with pytest.raises(ConfigError, match="graft-multiturn"):  # the plugin that provides it
        graft.compose([f"rollout.{old}={value}"])


def test_a_saved_config_with_the_old_defaults_still_composes(tmp_path: Path) -> None:
    """A config.yaml of an earlier version lists every key at its default."""
    lines = "".join(f"  {old}: {default}\n" for old, _, default in OLD_KEYS)
    (tmp_path / "config.yaml").write_text(f"rollout:\n{lines}  n: 8\n")
    cfg = graft.compose(config_files=[tmp_path / "config.yaml"])
    assert cfg.features.multiturn == MultiturnConfig()


def test_the_runner_serves_only_a_chosen_environment() -> None:
    tokenizer = builtin_tokenizer()
    assert build_episode_runner(cfg=graft.compose([]), tokenizer=tokenizer, env=None) is None
    cfg = graft.compose(["features.multiturn.environment=calculator",
                         "features.multiturn.max_turns=2"])
    runner = build_episode_runner(cfg=cfg, tokenizer=tokenizer, env=None)
    assert isinstance(runner, EpisodeRunner) and isinstance(runner, RunnerProtocol)
    assert (runner.limits.max_turns, runner.name) == (2, "calculator")
