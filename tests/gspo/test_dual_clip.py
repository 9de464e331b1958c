"""A default never conflicts with another setting: ``loss.policy_loss=gspo`` turns the default
``loss.clip_ratio_c`` off, a value the user set is an error (issue 36, finding 13). Moved from
tests/core/config/test_defaults_follow_choices.py: the rule is graft-gspo's now, so these compose
with a manager that loads that plugin alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graft.config import compose, to_yaml
from graft.errors import ConfigError
from graft.plugins import GraftPluginManager


@pytest.fixture
def alone() -> GraftPluginManager:
    """A manager with the installed graft-gspo and no other plugin."""
    loaded = GraftPluginManager()
    loaded.load(allowlist=["gspo"])
    return loaded


def test_gspo_alone_turns_the_default_dual_clip_off(alone: GraftPluginManager) -> None:
    cfg = compose(["loss.policy_loss=gspo"], manager=alone)
    assert cfg.loss.clip_ratio_c is None
    assert compose(manager=alone).loss.clip_ratio_c == 3.0  # PPO keeps its dual clip


def test_gspo_from_a_yaml_file_turns_the_default_off(alone: GraftPluginManager,
                                                     tmp_path: Path) -> None:
    config = tmp_path / "gspo.yaml"
    config.write_text("loss:\n  policy_loss: gspo\n")
    assert compose(config_files=[config], manager=alone).loss.clip_ratio_c is None


@pytest.mark.parametrize("where", ["override", "yaml"])
def test_gspo_with_a_dual_clip_the_user_set_is_an_error(alone: GraftPluginManager, tmp_path: Path,
                                                        where: str) -> None:
    config = tmp_path / "gspo.yaml"
    config.write_text("loss:\n  clip_ratio_c: 3.0\n")
    overrides = ["loss.policy_loss=gspo"]
    files = [config] if where == "yaml" else []
    if where == "override":
        overrides.append("loss.clip_ratio_c=3.0")  # the default's own value, set on purpose
    with pytest.raises(ConfigError, match=r"clip_ratio_c=3.0 would be ignored.*clip_ratio_c=null"):
        compose(overrides, config_files=files, manager=alone)


def test_graft_config_show_gspo_works(run_graft) -> None:
    shown = run_graft(["config", "show", "loss.policy_loss=gspo"])
    assert shown.returncode == 0, shown.stderr
    assert "clip_ratio_c: null" in shown.stdout
    refused = run_graft(["config", "show", "loss.policy_loss=gspo", "loss.clip_ratio_c=2.0"])
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "loss.clip_ratio_c=null" in refused.stderr


def test_config_yaml_of_a_gspo_run_composes_again(alone: GraftPluginManager,
                                                  tmp_path: Path) -> None:
    """A run's saved config (every key written out) composes as it was: ``graft export`` and
    ``--config runs/X/config.yaml`` read it."""
    saved = tmp_path / "config.yaml"
    saved.write_text(to_yaml(compose(["loss.policy_loss=gspo"], manager=alone)))
    again = compose(config_files=[saved], manager=alone)
    assert again.loss.policy_loss == "gspo" and again.loss.clip_ratio_c is None
    assert json.dumps(again.loss.__dict__) == json.dumps(
        compose(["loss.policy_loss=gspo"], manager=alone).loss.__dict__)
