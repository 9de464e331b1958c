"""Looking up model families (built-in and from plugins) and their presets."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from graft.errors import ConfigError, did_you_mean
from graft.models.builtin import BUILTIN_FAMILIES
from graft.models.family import ModelFamily
from graft.plugins import GraftPluginManager, get_plugin_manager
from graft.plugins.registry import collect_named

if TYPE_CHECKING:
    from transformers import PretrainedConfig


def model_families(manager: GraftPluginManager | None = None) -> dict[str, ModelFamily]:
    """Every known family by ``model_type``: built-ins, replaced or extended by plugins.

    Two plugins providing the same ``model_type`` is a `PluginError` naming both.
    """
    manager = manager or get_plugin_manager()
    provided = collect_named(manager, "graft_model_families", "model family",
                             key=lambda family: family.model_type, expect=ModelFamily)
    # A plugin's family replaces the built-in one of its model_type (keeping its position).
    return {**{family.model_type: family for family in BUILTIN_FAMILIES}, **provided}


def family_for(model_type: str, manager: GraftPluginManager | None = None) -> ModelFamily:
    """The family of ``model_type``; unknown types get a generic standard-layout family."""
    return model_families(manager).get(model_type) or ModelFamily(model_type)


PresetEntry = tuple[ModelFamily, Callable[..., "PretrainedConfig"]]


def presets(manager: GraftPluginManager | None = None) -> dict[str, PresetEntry]:
    """Preset name -> (family, config factory) over every family."""
    found: dict[str, PresetEntry] = {}
    for family in model_families(manager).values():
        for name, factory in family.presets.items():
            found[name] = (family, factory)
    return found


def preset(name: str, manager: GraftPluginManager | None = None) -> PresetEntry:
    """Look up a preset by name; `ConfigError` listing the valid names when unknown."""
    known = presets(manager)
    if name not in known:
        raise ConfigError(f"config key 'model.preset' is {name!r}, which is no preset."
                          f"{did_you_mean(name, known)} Presets: {', '.join(sorted(known))}.")
    return known[name]
