"""The installed plugin through Graft: graft.testing's conformance check, its section and its
bounds, the old ``loss.gspo_rollout_is*`` keys refused with the new ones named, its rules, the
loss in the registry (and not fused into the head), and the core without it."""

from __future__ import annotations

from pathlib import Path

import pytest

import graft
from graft.config import compose
from graft.errors import ConfigError
from graft.losses import is_token_separable
from graft.plugins import GraftPluginManager
from graft.testing import check_config_section, check_installed_plugin, check_moved_key
from graft_gspo import GspoConfig, gspo_loss


def test_the_installed_plugin_passes_graft_testing() -> None:
    assert set(check_installed_plugin("gspo")) == {"graft_config_sections", "graft_config_rules",
                                                   "graft_policy_losses"}
    assert check_config_section("gspo", GspoConfig) == {"rollout_is": "none",
                                                        "rollout_is_cap": 2.0}


@pytest.mark.parametrize("old, new, value", [
    ("loss.gspo_rollout_is", "features.gspo.rollout_is", "token"),
    ("loss.gspo_rollout_is_cap", "features.gspo.rollout_is_cap", "1.5")])
def test_an_old_loss_key_names_its_new_home(old: str, new: str, value: str,
                                            tmp_path: Path) -> None:
    check_moved_key(old, new, value, tmp_path)


def test_the_old_key_names_the_plugin_that_holds_it() -> None:
    with pytest.raises(ConfigError, match=r"'features\.gspo\.rollout_is' \(installed with "
                                          r"graft-gspo\)"):
        compose(["loss.gspo_rollout_is=token"])


def test_a_saved_config_with_the_old_defaults_still_composes(tmp_path: Path) -> None:
    """A config.yaml of an earlier version lists every key at its default."""
    (tmp_path / "config.yaml").write_text(
        "loss:\n  policy_loss: gspo\n  clip_ratio_c: null\n  gspo_rollout_is: none\n"
        "  gspo_rollout_is_cap: 2.0\n")
    cfg = graft.compose(config_files=[tmp_path / "config.yaml"])
    assert cfg.loss.policy_loss == "gspo" and cfg.features.gspo == GspoConfig()


@pytest.mark.parametrize("override", ["features.gspo.rollout_is=tokens",
                                      "features.gspo.rollout_is_cap=0",
                                      "features.gspo.rollout_is_cap=-1"])
def test_the_section_keeps_the_old_choices_and_bounds(override: str) -> None:
    with pytest.raises(ConfigError, match=override.split("=")[0].replace(".", r"\.")):
        compose(["loss.policy_loss=gspo", override])


def test_rollout_weights_need_gspo_and_no_second_correction() -> None:
    with pytest.raises(ConfigError, match=r"features\.gspo\.rollout_is=token weights GSPO's "
                                          r"loss, but loss\.policy_loss=ppo would ignore it"):
        compose(["features.gspo.rollout_is=token"])
    with pytest.raises(ConfigError, match=r"algorithm\.rollout_correction=mis and "
                                          r"features\.gspo\.rollout_is=token both weight"):
        compose(["algorithm.rollout_correction=mis", "loss.policy_loss=gspo",
                 "features.gspo.rollout_is=token"])
    compose(["algorithm.rollout_correction=mis", "loss.policy_loss=gspo"])
    compose(["loss.policy_loss=gspo", "features.gspo.rollout_is=sequence"])


def test_gspo_is_not_token_separable_so_the_head_does_not_fuse_it() -> None:
    # a token's loss depends on its sequence's ratio: the fused head, which takes the loss's
    # gradient chunk by chunk in the forward, would be wrong for it
    from graft.engine.head.token_loss import fuses_loss

    assert not is_token_separable(gspo_loss)
    assert not fuses_loss(gspo_loss, "seq-mean-token-mean", enabled=True, chunk_tokens=16)


def test_without_the_plugin_gspo_is_an_unknown_policy_loss() -> None:
    """The core alone (``GRAFT_PLUGINS=``) has no GSPO: the registry names what it has."""
    bare = GraftPluginManager()
    bare.load(candidates=[])
    with pytest.raises(ConfigError, match=r"'loss\.policy_loss' is 'gspo'\. Valid values: ppo"):
        compose(["loss.policy_loss=gspo"], manager=bare)
    assert not hasattr(compose(manager=bare).loss, "gspo_rollout_is")
