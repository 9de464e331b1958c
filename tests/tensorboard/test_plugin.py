"""The installed plugin through Graft: graft.testing's conformance check, its section, the old
``trainer.tensorboard`` key refused with the new one named, and the core without it."""

from __future__ import annotations

from pathlib import Path

import pytest

import graft
from graft.config import compose
from graft.errors import ConfigError
from graft.plugins import GraftPluginManager
from graft.testing import check_config_section, check_installed_plugin, check_moved_key
from graft_tensorboard import TensorBoardConfig


def test_the_installed_plugin_passes_graft_testing() -> None:
    assert set(check_installed_plugin("tensorboard")) == {
        "graft_config_sections", "graft_preflight", "graft_train_begin", "graft_step_end",
        "graft_train_end"}
    assert check_config_section("tensorboard", TensorBoardConfig) == {"enabled": False}


def test_the_old_core_key_names_the_new_one(tmp_path: Path) -> None:
    check_moved_key("trainer.tensorboard", "features.tensorboard.enabled", "true", tmp_path)


def test_the_old_key_names_the_plugin_that_holds_it() -> None:
    with pytest.raises(ConfigError, match=r"'trainer\.tensorboard' \(the command line\) moved: set "
                                          r"'features\.tensorboard\.enabled' \(installed with "
                                          r"graft-tensorboard\)"):
        compose(["trainer.tensorboard=true"])


def test_a_saved_config_with_the_old_default_still_composes(tmp_path: Path) -> None:
    """A config.yaml of an earlier version lists every key at its default."""
    (tmp_path / "config.yaml").write_text("trainer:\n  total_steps: 3\n  tensorboard: false\n")
    cfg = graft.compose(config_files=[tmp_path / "config.yaml"])
    assert cfg.trainer.total_steps == 3 and cfg.features.tensorboard == TensorBoardConfig()


def test_the_core_alone_has_no_tensorboard_key() -> None:
    """The core alone (``GRAFT_PLUGINS=``): no ``features.tensorboard``, and the old key is
    still refused with the new one named."""
    bare = GraftPluginManager()
    bare.load(candidates=[])
    cfg = compose(manager=bare)
    assert not hasattr(cfg.trainer, "tensorboard") and not hasattr(cfg.features, "tensorboard")
    with pytest.raises(ConfigError, match=r"features\.tensorboard\.enabled"):
        compose(["trainer.tensorboard=true"], manager=bare)
