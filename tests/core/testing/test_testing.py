"""graft.testing: what plugin authors run in their own test suites."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from graft import hookimpl
from graft.errors import PluginError
from graft.plugins import get_plugin_manager
from graft.testing import (
    check_config_section,
    check_installed_plugin,
    check_plugin,
    registered_plugin,
)


@dataclass
class GoodSection:
    cache_limit_gb: float = 4.0


@dataclass
class NoDefaultSection:
    cache_limit_gb: float


class GoodPlugin:
    @hookimpl
    def graft_config_sections(self):
        return [("good", GoodSection)]

    @hookimpl
    def graft_step_begin(self, step):
        self.last_step = step


class WrongArgPlugin:
    @hookimpl
    def graft_loss_aggregate(self, loss_mat, mask, mode):
        return None


def test_check_plugin_returns_hooks() -> None:
    assert check_plugin(GoodPlugin()) == ["graft_config_sections", "graft_step_begin"]


def test_check_plugin_names_the_wrong_argument() -> None:
    with pytest.raises(PluginError, match="'mask'.*Did you mean 'loss_mask'"):
        check_plugin(WrongArgPlugin())


def test_check_config_section_returns_defaults() -> None:
    assert check_config_section("good", GoodSection) == {"cache_limit_gb": 4.0}


def test_check_config_section_rejects_fields_without_default() -> None:
    with pytest.raises(PluginError, match="'cache_limit_gb'.*has no default"):
        check_config_section("nodefault", NoDefaultSection)


def test_check_installed_plugin(plugin_sites: dict[str, Path],
                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(plugin_sites["demo"]))
    assert "graft_export_slots" in check_installed_plugin("demo")
    with pytest.raises(PluginError, match="no installed distribution"):
        check_installed_plugin("absent")


def test_registered_plugin_is_removed_afterwards(clean_env: None) -> None:
    plugin = GoodPlugin()
    with registered_plugin(plugin, "good") as manager:
        manager.hook.graft_step_begin(step=4)
        assert "good" in manager.config_sections
    assert plugin.last_step == 4
    assert "good" not in get_plugin_manager().loaded_names()


def test_graft_plugin_fixture(graft_plugin, clean_env: None) -> None:
    plugin = GoodPlugin()
    manager = graft_plugin(plugin, name="fixture-good")
    manager.hook.graft_step_begin(step=2)
    assert plugin.last_step == 2
