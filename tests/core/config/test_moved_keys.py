"""Keys that left their section (`graft.config.MOVED_KEYS`): a `ConfigError` naming the new key
from the command line and from a YAML file, whether or not the plugin that now holds it is
loaded; the old default, as a config.yaml of an earlier version lists it, is dropped."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from graft.config import MOVED_KEYS, compose, register_moved_key
from graft.errors import ConfigError
from graft.plugins import GraftPluginManager


@pytest.fixture
def core_only() -> GraftPluginManager:
    manager = GraftPluginManager()
    manager.load(candidates=[])  # the core's built-in plugins only
    return manager


@pytest.fixture
def moved_seed() -> Iterator[None]:
    """``trainer.old_seed`` moved to ``trainer.seed`` for the test's duration."""
    register_moved_key("trainer.old_seed", "trainer.seed", default=0)
    yield
    del MOVED_KEYS["trainer.old_seed"]


def test_a_key_that_left_the_core_names_its_new_home(core_only, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'engine.mlp_chunk_tokens' .*moved: set "
                       "'features.activation_memory.mlp_chunk_tokens' .*graft-activation-memory"):
        compose(["engine.mlp_chunk_tokens=64"], manager=core_only)
    (tmp_path / "run.yaml").write_text("engine:\n  recompute_norms: true\n")
    with pytest.raises(ConfigError, match="run.yaml, line 2.*'features.activation_memory."
                       "recompute_norms'"):
        compose(config_files=[tmp_path / "run.yaml"], manager=core_only)


def test_export_delta_names_graft_vllm_without_it(core_only) -> None:
    with pytest.raises(ConfigError, match="'export.delta' .*moved: set 'features.vllm.delta' "
                       ".*graft-vllm"):
        compose(["export.delta=true"], manager=core_only)
    assert not hasattr(compose(["export.delta=false"], manager=core_only).export, "delta")


def test_a_plugin_registers_a_key_it_moved(core_only, moved_seed, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'trainer.old_seed' \\(the command line\\) moved: "
                       "set 'trainer.seed' instead"):
        compose(["trainer.old_seed=3"], manager=core_only)
    (tmp_path / "config.yaml").write_text("trainer:\n  old_seed: 0\n  seed: 5\n")
    assert compose(config_files=[tmp_path / "config.yaml"], manager=core_only).trainer.seed == 5
    assert compose(["trainer.old_seed=0"], manager=core_only).trainer.seed == 0
