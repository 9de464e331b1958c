"""Helpers for plugin authors' own tests.

* `check_plugin(plugin)`: every hookimpl matches a spec (names and arguments) and every config
  section composes into the full schema. Raises `graft.errors.PluginError` with the fix.
* `check_installed_plugin(name)`: the same for the plugin installed under entry-point ``name``.
* `check_config_section(name, dataclass)`: the section composes; returns its default values.
* `registered_plugin(plugin)`: register a plugin in this process temporarily, in place of an
  installed plugin of the same name if there is one (also the pytest fixture ``graft_plugin``,
  available automatically once graft is installed).
* What a registry plugin's tests call, as the trainer calls it (these import torch when first
  used): `aggregate_loss(loss_mat, loss_mask, mode, ctx, manager)` reduces a micro-batch's loss
  matrix through ``graft_loss_aggregate`` (plugins first, then the core's modes), with an
  `AggregationContext` (the mini-batch's normalisers a ``graft_loss_aggregate`` gets as
  ``ctx``); `advantage_estimators(manager)` is every ``algorithm.advantage`` by name and
  `compute_advantages(estimator, rewards, group_size=, cfg=)` runs one (finite values checked).

Submodules (import torch): `graft.testing.families` (a model family's conformance and HF export
checks; `parallelized_step`, for a ``graft_pre_shard`` plugin's tests),
`graft.testing.invariance` (a loss's gradient is the same however a mini-batch is split over
ranks and micro-batches), `graft.testing.checkpoint` (`check_plugin_on_checkpoint`: a
plugin run through ``graft train`` from a saved tiny checkpoint, ``model.path``, on 1 or more
ranks, reports its metrics and matches the same run on the preset; `save_tiny_checkpoint`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from graft.errors import PluginError
from graft.lazy import lazy_attributes
from graft.plugins import GraftPluginManager, PluginRecord, get_plugin_manager
from graft.plugins.discovery import discover_candidates

__all__ = [
    "AggregationContext",
    "advantage_estimators",
    "aggregate_loss",
    "check_config_section",
    "check_installed_plugin",
    "check_moved_key",
    "check_plugin",
    "compute_advantages",
    "registered_plugin",
    "write_chat_checkpoint",
]

# Torch-importing names, loaded on first access (the core's own definitions).
_LAZY = {
    "AggregationContext": "graft.losses",
    "aggregate_loss": "graft.losses",
    "advantage_estimators": "graft.rl.advantages",
    "compute_advantages": "graft.rl.advantages",
    "write_chat_checkpoint": "graft.testing.chat",
}


__getattr__ = lazy_attributes(__name__, _LAZY)


def check_plugin(plugin: object, name: str = "plugin-under-test") -> list[str]:
    """Verify ``plugin`` against the hook specs and the config schema; return its hook names."""
    from graft.config import compose

    manager = GraftPluginManager()
    manager.load(candidates=[])  # the core's built-in plugins only
    record = manager.register(plugin, name)
    compose(manager=manager)
    return record.hooks


def check_installed_plugin(name: str) -> list[str]:
    """Load the installed plugin ``name`` from its entry point and run `check_plugin` on it."""
    for candidate in discover_candidates():
        if candidate.name == name:
            return check_plugin(candidate.entry_point.load(), name)
    raise PluginError(f"no installed distribution exposes the Graft plugin {name!r}")


def check_config_section(name: str, schema: type) -> dict[str, Any]:
    """Compose ``schema`` as ``features.<name>``; return the section's default values."""
    from omegaconf import OmegaConf

    from graft.config import compose
    from graft.hookspecs import hookimpl

    class _SectionPlugin:
        @staticmethod
        @hookimpl
        def graft_config_sections() -> list[tuple[str, type]]:
            return [(name, schema)]

    manager = GraftPluginManager()
    manager.load(candidates=[])
    manager.register(_SectionPlugin(), f"section-{name}")
    cfg = compose(manager=manager)
    return OmegaConf.to_container(OmegaConf.structured(getattr(cfg.features, name)))


def check_moved_key(old: str, new: str, value: str, folder: Path) -> None:
    """Assert that the config key ``old``, which a release moved to ``new``, set to ``value``
    is a `graft.errors.ConfigError` that names ``new``: on the command line, and in a YAML file
    written into ``folder``, where the error also names the file and line."""
    import pytest

    from graft.config import compose
    from graft.errors import ConfigError

    with pytest.raises(ConfigError, match=f"'{re.escape(old)}'.*moved: set '{re.escape(new)}'"):
        compose([f"{old}={value}"])
    section, key = old.split(".")
    (folder / "run.yaml").write_text(f"{section}:\n  {key}: {value}\n")
    with pytest.raises(ConfigError, match=f"run.yaml, line 2\\).*'{re.escape(new)}'"):
        compose(config_files=[folder / "run.yaml"])


@contextmanager
def registered_plugin(plugin: object, name: str | None = None,
                      manager: GraftPluginManager | None = None) -> Iterator[GraftPluginManager]:
    """Register ``plugin`` (in the process's manager by default) for the duration of the block.

    A plugin already loaded under that name (the installed copy of the plugin under test), or
    ``plugin`` itself loaded under another name, is taken out for the block and put back
    afterwards, so the test sees ``plugin`` once. Graft's built-in plugins cannot be replaced.
    """
    manager = manager or get_plugin_manager()
    plugin_name = name or getattr(plugin, "__name__", None) or f"test-plugin-{id(plugin)}"
    taken: list[tuple[object | None, PluginRecord]] = []
    try:
        for held_name in dict.fromkeys([plugin_name, manager.pm.get_name(plugin)]):
            if held_name is not None and held_name in manager.records:
                taken.append(_take_out(manager, held_name))
        manager.register(plugin, plugin_name)
        try:
            yield manager
        finally:
            manager.unregister(plugin_name)
    finally:
        for held, record in reversed(taken):
            _put_back(manager, held, record)


def _take_out(manager: GraftPluginManager, name: str) -> tuple[object | None, PluginRecord]:
    """Unregister the plugin ``name`` if loaded; return it (None if not loaded) and its record."""
    record = manager.records[name]
    if record.status == "builtin":
        raise PluginError(f"{name!r} is one of Graft's built-in plugins; register the plugin under "
                          f"test under another name")
    held = manager.pm.get_plugin(name) if record.status == "loaded" else None
    if held is not None:
        manager.unregister(name)
    return held, record


def _put_back(manager: GraftPluginManager, held: object | None, record: PluginRecord) -> None:
    """Undo `_take_out`: register the plugin again (if it was loaded) with its original record."""
    if held is not None:
        manager.register(held, record.name, distribution=record.distribution,
                         version=record.version, target=record.target)
    manager.records[record.name] = record
