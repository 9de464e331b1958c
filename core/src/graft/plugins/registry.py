"""Registries that plugins extend through a hook returning named objects."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pluggy

from graft.errors import PluginError
from graft.plugins.keywords import REGISTRY_CALLS, check_signature

if TYPE_CHECKING:
    from graft.plugins.manager import GraftPluginManager


def collect_named(manager: GraftPluginManager, hook_name: str, kind: str, *,
                  key: Callable[[Any], str] | None = None,
                  expect: type | None = None) -> dict[str, Any]:
    """Merge every implementation's objects by name; one name from two plugins is an error.

    Implementations return ``{name: object}``, or, with ``key``, a list of objects each named
    ``key(object)`` (model families by ``model_type``). ``kind`` names the registry in messages
    ("policy loss", "reward"); with ``expect`` an object of another type is a `PluginError`
    naming the plugin. Every function an entry holds is checked against the registry's calling
    convention (`graft.plugins.keywords.REGISTRY_CALLS`). Each implementation is called through
    pluggy's hook machinery (one implementation at a time, so every object is attributed to its
    plugin), which makes the calls visible to ``GRAFT_TRACE_PLUGINS``. Order: implementations in
    registration order, then their own order.
    """
    hook = getattr(manager.hook, hook_name)
    found: dict[str, Any] = {}
    owner: dict[str, str] = {}
    for impl in hook.get_hookimpls():
        for name, value in _entries(impl, hook, key, expect, manager.pm):
            if name in owner:
                raise PluginError(f"plugins {owner[name]!r} and {impl.plugin_name!r} both declare "
                                  f"the {kind} {name!r}; disable one (--disable-plugin)")
            owner[name], found[name] = impl.plugin_name, value
    return found


def registry_names(hook_name: str, kind: str) -> Callable[..., list[str]]:
    """``names(*, manager)``: the sorted names ``hook_name``'s registry holds with ``manager``'s
    plugins, for ``graft_config_choices`` (a config choice that names the registry)."""
    return lambda *, manager: sorted(collect_named(manager, hook_name, kind))


def implementers_without(manager: GraftPluginManager, hook_name: str,
                         companion: str) -> list[str]:
    """Names of the plugins that implement ``hook_name`` but not ``companion`` (a loss
    aggregator that declares no mode: ``graft_loss_aggregate`` without ``graft_loss_agg_modes``)."""
    declared = {impl.plugin_name for impl in getattr(manager.hook, companion).get_hookimpls()}
    return [impl.plugin_name for impl in getattr(manager.hook, hook_name).get_hookimpls()
            if impl.plugin_name not in declared]


def verify_registry_entries(manager: GraftPluginManager, plugin_name: str) -> None:
    """Check the entries ``plugin_name`` gives every registry, when the plugin registers.

    Calls each registry hook the plugin implements (registry hooks are cheap and mutate
    nothing) and refuses, with a `PluginError` naming the plugin, the entry and the keywords it
    may take, a function that the registry's calling convention cannot call
    (`graft.plugins.keywords.check_signature`), so a broken plugin fails to load (``graft
    plugins`` says why) instead of failing at a training step.
    """
    for hook_name in REGISTRY_CALLS:
        hook = getattr(manager.hook, hook_name)
        for impl in hook.get_hookimpls():
            if impl.plugin_name == plugin_name:
                _entries(impl, hook, _key_of(hook_name), None, manager.pm)


def _key_of(hook_name: str) -> Callable[[Any], str] | None:
    """How the entries of a list-returning registry are named (model families by type)."""
    if hook_name == "graft_model_families":
        return lambda family: getattr(family, "model_type", repr(family))
    return None


def _call_one(hook: pluggy.HookCaller, impl: pluggy.HookImpl,
              manager: pluggy.PluginManager) -> Any:
    """``impl``'s result, called through the manager's hook execution (traced, monitored)."""
    others = [i.plugin for i in hook.get_hookimpls() if i is not impl]
    results = manager.subset_hook_caller(hook.name, remove_plugins=others)()
    return results[0] if results else None


def _entries(impl: pluggy.HookImpl, hook: pluggy.HookCaller, key: Callable[[Any], str] | None,
             expect: type | None, manager: pluggy.PluginManager) -> list[tuple[str, Any]]:
    """The ``(name, object)`` pairs one implementation returns, type-checked before naming."""
    result = _call_one(hook, impl, manager) or {}
    values = list(result.values() if key is None else result)
    for value in values:
        if expect is not None and not isinstance(value, expect):
            raise PluginError(f"plugin {impl.plugin_name!r}: {hook.name} must return "
                              f"{expect.__name__} objects, got {value!r}")
    pairs = list(result.items()) if key is None else [(key(value), value) for value in values]
    call = REGISTRY_CALLS.get(hook.name)
    if call is not None:
        for name, value in pairs:
            check_signature(call, value, name=name, plugin=impl.plugin_name)
    return pairs
