"""``graft_config_rules``: a plugin's cross-field rules run on the composed config; a rule that
takes ``user_keys`` fits a default the user left, before the checks, and never a value they set."""

from __future__ import annotations

import pytest

from graft import compose, hookimpl
from graft.config import was_set
from graft.errors import ConfigError
from graft.plugins import GraftPluginManager


class ChecksEvenSteps:
    """A plugin: odd ``trainer.total_steps`` are refused, and ``trainer.log_every_steps`` left at
    its default follows ``trainer.total_steps``."""

    @hookimpl
    def graft_config_rules(self) -> list:
        def even_steps(cfg) -> None:
            if cfg.trainer.total_steps % 2:
                raise ConfigError(f"trainer.total_steps={cfg.trainer.total_steps} is odd")

        def log_every_step_of_short_runs(cfg, user_keys) -> None:
            if not was_set("trainer.log_every_steps", user_keys):
                cfg.trainer.log_every_steps = cfg.trainer.total_steps + 1  # odd: checked after

        return [even_steps, log_every_step_of_short_runs]


@pytest.fixture
def manager() -> GraftPluginManager:
    loaded = GraftPluginManager()
    loaded.load(allowlist=[])
    loaded.register(ChecksEvenSteps(), "even_steps")
    return loaded


def test_hook_graft_config_rules_refuses_what_a_rule_names(manager: GraftPluginManager) -> None:
    with pytest.raises(ConfigError, match="trainer.total_steps=3 is odd"):
        compose(["trainer.total_steps=3"], manager=manager)


def test_a_rule_with_user_keys_fits_only_defaults_and_runs_first(
        manager: GraftPluginManager) -> None:
    cfg = compose(["trainer.total_steps=4"], manager=manager)
    assert cfg.trainer.log_every_steps == 5
    chosen = compose(["trainer.total_steps=4", "trainer.log_every_steps=2"], manager=manager)
    assert chosen.trainer.log_every_steps == 2


def test_without_the_plugin_nothing_is_checked() -> None:
    bare = GraftPluginManager()
    bare.load(allowlist=[])
    assert compose(["trainer.total_steps=3"], manager=bare).trainer.total_steps == 3
