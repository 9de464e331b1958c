"""What the config checks comes from the packages and plugins, through hooks (the config imports
none of them): ``graft_config_choices`` (the registries a choice names) and ``graft_preflight``
(``graft train``'s checks of the files a run loads)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from graft import hookimpl
from graft.config import choice, compose
from graft.config.registries import registries
from graft.config.validate import preflight
from graft.errors import ConfigError, PluginError
from graft.plugins import GraftPluginManager


@dataclass
class PaintConfig:
    color: str = choice("red", registry="colors")


class Paint:
    """A plugin whose section's choice names a registry it declares, with a hint."""

    @hookimpl
    def graft_config_sections(self):
        return [("paint", PaintConfig)]

    @hookimpl
    def graft_config_choices(self):
        return {"colors": (lambda *, manager: ["red", "blue"],
                           lambda *, manager: " Colors come from the paint plugin.")}


class OtherColors:
    @hookimpl
    def graft_config_choices(self):
        return {"colors": lambda *, manager: ["green"]}


class NeedsAFile:
    """A plugin that refuses to run without the file its setting names."""

    @hookimpl
    def graft_preflight(self, cfg):
        if not (Path(cfg.trainer.run_dir).parent / "weights.bin").exists():
            raise ConfigError("features.paint needs weights.bin next to trainer.run_dir")


def manager_with(**plugins: object) -> GraftPluginManager:
    manager = GraftPluginManager()
    manager.load(allowlist=[])
    for name, plugin in plugins.items():
        manager.register(plugin, name)
    return manager


def test_hook_graft_config_choices_checks_a_plugin_registry() -> None:
    manager = manager_with(paint=Paint())
    assert compose(["features.paint.color=blue"], manager=manager).features.paint.color == "blue"
    with pytest.raises(ConfigError, match=r"'features.paint.color' is 'bleu'. Did you mean "
                                          r"'blue'\? Valid values: red, blue. Colors come from"):
        compose(["features.paint.color=bleu"], manager=manager)


def test_the_core_packages_declare_their_registries() -> None:
    assert set(registries(manager_with())) == {
        "model_presets", "policy_losses", "loss_agg_modes", "rewards", "advantage_estimators",
        "rollout_engines", "environments", "trainer_modes", "rollout_corrections"}


def test_one_registry_from_two_plugins_is_refused() -> None:
    with pytest.raises(PluginError, match="'paint' and 'other' both declare the config "
                                          "registry 'colors'"):
        compose([], manager=manager_with(paint=Paint(), other=OtherColors()))


def test_hook_graft_preflight_refuses_before_the_run(tmp_path: Path) -> None:
    cfg = compose([f"trainer.run_dir={tmp_path / 'run'}"], manager=manager_with())
    preflight(cfg, manager_with())  # the core's checks pass: a preset, a writable folder
    with pytest.raises(ConfigError, match="needs weights.bin"):
        preflight(cfg, manager_with(needs=NeedsAFile()))
    (tmp_path / "weights.bin").write_text("")
    preflight(cfg, manager_with(needs=NeedsAFile()))
