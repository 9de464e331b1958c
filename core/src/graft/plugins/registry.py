"""Registries that plugins extend through a hook returning named objects."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pluggy

from graft.errors import PluginError


def collect_named(hook: pluggy.HookCaller, kind: str, *, key: Callable[[Any], str] | None = None,
                  expect: type | None = None) -> dict[str, Any]:
    """Merge every implementation's objects by name; one name from two plugins is an error.

    Implementations return ``{name: object}``, or, with ``key``, a list of objects each named
    ``key(object)`` (model families by ``model_type``). ``kind`` names the registry in messages
    ("policy loss", "reward"); with ``expect`` an object of another type is a `PluginError`
    naming the plugin. Order: implementations in registration order, then their own order.
    """
    found: dict[str, Any] = {}
    owner: dict[str, str] = {}
    for impl in hook.get_hookimpls():
        for name, value in _entries(impl, hook.name, key, expect):
            if name in owner:
                raise PluginError(f"plugins {owner[name]!r} and {impl.plugin_name!r} both declare "
                                  f"the {kind} {name!r}; disable one (--disable-plugin)")
            owner[name], found[name] = impl.plugin_name, value
    return found


def _entries(impl: pluggy.HookImpl, hook_name: str, key: Callable[[Any], str] | None,
             expect: type | None) -> list[tuple[str, Any]]:
    """The ``(name, object)`` pairs one implementation returns, type-checked before naming."""
    result = impl.function() or {}
    values = list(result.values() if key is None else result)
    for value in values:
        if expect is not None and not isinstance(value, expect):
            raise PluginError(f"plugin {impl.plugin_name!r}: {hook_name} must return "
                              f"{expect.__name__} objects, got {value!r}")
    return list(result.items()) if key is None else [(key(value), value) for value in values]
