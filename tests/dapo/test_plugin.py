"""The installed plugin through Graft: graft.testing's conformance check, its section and its
bounds, the old ``algorithm.*`` keys refused with the new ones named, its config rule, its
``graft_batch_shaper`` (None until something is shaped), and short ``graft train`` runs on one
and two gloo ranks (moved from tests/core/rl/test_batch_shaping.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

import graft
from graft.config import compose
from graft.errors import ConfigError
from graft.plugins import get_plugin_manager
from graft.testing import check_config_section, check_installed_plugin, check_moved_key
from graft_dapo import DapoConfig, DapoShaper
from graft_dapo.config import check_dapo

CPU = None  # the env argument; the shaper only keeps it


def test_the_installed_plugin_passes_graft_testing() -> None:
    assert set(check_installed_plugin("dapo")) == {"graft_config_sections", "graft_config_rules",
                                                   "graft_batch_shaper"}
    assert check_config_section("dapo", DapoConfig) == {
        "dynamic_sampling": False, "max_sampling_rounds": 4, "overlong": "none",
        "overlong_buffer": None, "overlong_penalty": 1.0}


@pytest.mark.parametrize("old, new, value", [
    ("algorithm.dynamic_sampling", "features.dapo.dynamic_sampling", "true"),
    ("algorithm.max_sampling_rounds", "features.dapo.max_sampling_rounds", "3"),
    ("algorithm.overlong", "features.dapo.overlong", "filter"),
    ("algorithm.overlong_buffer", "features.dapo.overlong_buffer", "16"),
    ("algorithm.overlong_penalty", "features.dapo.overlong_penalty", "0.5")])
def test_an_old_algorithm_key_names_its_new_home(old: str, new: str, value: str,
                                                 tmp_path: Path) -> None:
    check_moved_key(old, new, value, tmp_path)


def test_a_saved_config_with_the_old_defaults_still_composes(tmp_path: Path) -> None:
    """A config.yaml of an earlier version lists every key at its default."""
    (tmp_path / "config.yaml").write_text(
        "algorithm:\n  dynamic_sampling: false\n  max_sampling_rounds: 4\n  overlong: none\n"
        "  overlong_buffer: null\n  overlong_penalty: 1.0\n")
    cfg = graft.compose(config_files=[tmp_path / "config.yaml"])
    assert cfg.features.dapo == DapoConfig()


@pytest.mark.parametrize("override", ["features.dapo.max_sampling_rounds=0",
                                      "features.dapo.overlong=soft",
                                      "features.dapo.overlong_buffer=0",
                                      "features.dapo.overlong_penalty=-1"])
def test_the_section_keeps_the_old_bounds(override: str) -> None:
    with pytest.raises(ConfigError, match=override.split("=")[0].replace(".", r"\.")):
        compose([override])


def test_rules_refuse_lone_samples_and_a_buffer_longer_than_the_response() -> None:
    with pytest.raises(ConfigError, match="rollout.n=1"):  # the group estimators' rule, first
        compose(["features.dapo.dynamic_sampling=true", "rollout.n=1"])
    # graft-dapo's own, for an estimator of a plugin's that takes lone samples
    cfg = SimpleNamespace(trainer=SimpleNamespace(mode="rl"), rollout=SimpleNamespace(n=1),
                          features=SimpleNamespace(dapo=DapoConfig(dynamic_sampling=True)))
    with pytest.raises(ConfigError, match=r"features\.dapo\.dynamic_sampling=true .*rollout.n=1 "
                       "every prompt would be dropped"):
        check_dapo(cfg=cfg)
    with pytest.raises(ConfigError, match=r"features\.dapo\.overlong_buffer=9"):
        compose(["features.dapo.overlong=penalty", "features.dapo.overlong_buffer=9",
                 "rollout.max_new_tokens=8"])
    compose(["features.dapo.overlong=filter", "features.dapo.overlong_buffer=9",
             "rollout.max_new_tokens=8"])
    compose(["trainer.mode=sft", "features.dapo.dynamic_sampling=true", "rollout.n=1"])


@pytest.mark.parametrize("overrides, shapes", [
    ([], False), (["features.dapo.dynamic_sampling=true"], True),
    (["features.dapo.overlong=filter"], True), (["features.dapo.overlong=penalty"], True)])
def test_the_hook_answers_only_when_something_is_shaped(overrides: list[str],
                                                        shapes: bool) -> None:
    cfg = compose(["rollout.max_new_tokens=12", *overrides])
    got = get_plugin_manager().hook.graft_batch_shaper(cfg=cfg, env=CPU, eos_token_id=2)
    assert isinstance(got, DapoShaper) if shapes else got is None
    if shapes:
        assert got.buffer == 2  # a fifth of rollout.max_new_tokens by default
