"""A default never conflicts with another setting: only a value the user set can break a rule.

``loss.policy_loss=gspo`` with the default ``loss.clip_ratio_c`` (issue 36, finding 13; the
plugins' own, such as graft-vllm's context length, are in their tests).
"""

from __future__ import annotations

import json
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
