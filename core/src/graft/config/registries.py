"""The registries a config value can name (``choice(..., registry=...)``), resolved with the
plugins of a run when the config is validated.

Each package declares the registries it owns through ``graft_config_choices`` (graft.models:
``model_presets``; graft.losses: ``policy_losses``, ``loss_agg_modes``; graft.rl: ``rewards``,
``advantage_estimators``, ``rollout_corrections``; graft.rollout: ``rollout_engines``, ``environments``;
graft.training: ``trainer_modes``), as can a plugin. Their names are looked up without
importing torch, so ``graft config show|check`` stays fast.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from graft.config.hooks import PluginManager, call_declared, each_result
from graft.errors import PluginError

Names = Callable[..., list[str]]


def registries(manager: PluginManager) -> dict[str, tuple[Names, Names | None]]:
    """Registry name -> ``(names, hint)`` (hint None: no hint) from every plugin's
    ``graft_config_choices``; one registry declared by two plugins is a `PluginError`."""
    found: dict[str, tuple[Names, Names | None]] = {}
    owner: dict[str, str] = {}
    for plugin, declared in each_result(manager, "graft_config_choices"):
        for registry, entry in (declared or {}).items():
            if registry in owner:
                raise PluginError(f"plugins {owner[registry]!r} and {plugin!r} both declare the "
                                  f"config registry {registry!r}; disable one (--disable-plugin)")
            owner[registry] = plugin
            found[registry] = entry if isinstance(entry, tuple) else (entry, None)
    return found


def registry_names(registry: str, manager: PluginManager) -> list[str]:
    """The names in ``registry`` for the plugins loaded in ``manager``."""
    return call_declared(_entry(registry, manager)[0], manager=manager)


def registry_hint(registry: str, manager: PluginManager) -> str:
    """The sentence ``registry`` appends to the error for a value it does not hold ("": none)."""
    hint = _entry(registry, manager)[1]
    return "" if hint is None else call_declared(hint, manager=manager)


def _entry(registry: str, manager: PluginManager) -> tuple[Names, Names | None]:
    known: dict[str, Any] = registries(manager)
    if registry not in known:
        raise KeyError(f"unknown registry {registry!r}; known: {', '.join(known)}")
    return known[registry]
