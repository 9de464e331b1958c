"""Registries that plugins extend through a hook returning ``{name: object}``."""

from __future__ import annotations

from typing import Any

import pluggy

from graft.errors import PluginError


def collect_named(hook: pluggy.HookCaller, kind: str) -> dict[str, Any]:
    """Merge every implementation's ``{name: object}``; one name from two plugins is an error.

    ``kind`` names the registry in the message ("policy loss", "reward").
    """
    found: dict[str, Any] = {}
    owner: dict[str, str] = {}
    for impl in hook.get_hookimpls():
        for name, value in (impl.function() or {}).items():
            if name in owner:
                raise PluginError(f"plugins {owner[name]!r} and {impl.plugin_name!r} both declare "
                                  f"the {kind} {name!r}; disable one (--disable-plugin)")
            owner[name], found[name] = impl.plugin_name, value
    return found
