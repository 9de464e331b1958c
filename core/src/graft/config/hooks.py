"""How the config reaches the plugins: through the manager it is given, never by import.

``graft.config`` imports no other graft package (tests/core/test_layering.py). The core's
packages and the plugins reach it through hooks (config sections, rules, choice registries,
`auto` pins), which it calls on a `PluginManager` (`graft.plugins.GraftPluginManager`). A call
given no manager uses the process's: the package ``graft`` points the config at it on import
(`use_process_manager`), before any of the config's modules can run.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol


class PluginManager(Protocol):
    """What the config reads of `graft.plugins.GraftPluginManager`."""

    config_sections: Mapping[str, Any]  # section name -> its ConfigSection (``.schema``)
    records: Mapping[str, Any]  # plugin name -> its PluginRecord (``.status``, ``.target``)
    pm: Any  # the pluggy manager

    @property
    def hook(self) -> Any:
        """The hook relay."""

    def loaded_names(self) -> list[str]:
        """Names of the plugins whose hooks are active."""


_process_manager: Callable[[], PluginManager] | None = None


def use_process_manager(get: Callable[[], PluginManager]) -> None:
    """Make ``get()`` the manager of every config call given none (``graft`` does, on import)."""
    global _process_manager
    _process_manager = get


def plugin_manager(manager: PluginManager | None = None) -> PluginManager:
    """``manager``, or the process's (its plugins are loaded on first use)."""
    if manager is not None:
        return manager
    if _process_manager is None:
        raise RuntimeError("no plugin manager: pass manager= (importing graft sets the default)")
    return _process_manager()


def each_result(manager: PluginManager, hook_name: str, **kwargs: Any) -> Iterator[tuple[str, Any]]:
    """``(plugin name, result)`` of every implementation of ``hook_name``, in registration order
    (the core's packages first), each called alone through pluggy (so a result is attributed to
    its plugin, and ``GRAFT_TRACE_PLUGINS`` sees the call)."""
    hook = getattr(manager.hook, hook_name)
    for impl in hook.get_hookimpls():
        others = [i.plugin for i in hook.get_hookimpls() if i is not impl]
        results = manager.pm.subset_hook_caller(hook_name, remove_plugins=others)(**kwargs)
        yield impl.plugin_name, (results[0] if results else None)


def call_declared(fn: Callable[..., Any], **offered: Any) -> Any:
    """``fn`` called with the ``offered`` keywords it declares (a rule, a registry's names)."""
    declared = inspect.signature(fn).parameters
    return fn(**{name: value for name, value in offered.items() if name in declared})
