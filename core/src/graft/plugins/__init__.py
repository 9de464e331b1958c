"""The process-wide plugin manager: loaded once, on first use.

``GRAFT_PLUGINS`` (allowlist; unset = all, empty = none) and ``GRAFT_DISABLE_PLUGINS`` (set by
``--disable-plugin``) are read then; both are inherited by processes that torchrun starts, so
every rank sees the same plugins.

For a plugin that consumes a registry (graft-multiturn's environments): `collect_named` (every
plugin's named objects of a registry hook, one name from two plugins a `PluginError`) and
`call_with_keywords` (a registry's function called with the keywords it declares). For a
plugin that imports a module it does not declare (a reward's dependency, in a worker process):
`install_hint` (the pip command that installs it).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import pluggy

from graft.plugins.discovery import DISABLE_ENV, allowlist_from_env, disabled_from_env, install_hint
from graft.plugins.keywords import call_with_keywords
from graft.plugins.manager import ConfigSection, GraftPluginManager, PluginRecord
from graft.plugins.registry import collect_named

__all__ = [
    "ConfigSection",
    "GraftPluginManager",
    "PluginRecord",
    "call_with_keywords",
    "collect_named",
    "get_plugin_manager",
    "hook",
    "install_hint",
    "load_plugins",
]

_manager: GraftPluginManager | None = None


def load_plugins(*, disabled: Sequence[str] = ()) -> GraftPluginManager:
    """Load the plugins of this process once, skipping ``disabled`` (plus ``GRAFT_DISABLE_PLUGINS``).

    The disabled names are exported to ``GRAFT_DISABLE_PLUGINS`` so child processes agree.
    Calling it again returns the same manager; asking then for a different disabled set is an
    error, because hooks may already have run with the first set.
    """
    global _manager
    wanted = sorted(set(disabled_from_env()) | set(disabled))
    if _manager is not None:
        if wanted != sorted(set(disabled_from_env())):
            raise RuntimeError("plugins were already loaded in this process; disable them earlier")
        return _manager
    if wanted:
        os.environ[DISABLE_ENV] = ",".join(wanted)
    manager = GraftPluginManager()
    manager.load(allowlist=allowlist_from_env(), disabled=wanted)
    _manager = manager
    return manager


def get_plugin_manager() -> GraftPluginManager:
    """The process's plugin manager, loading plugins on first use."""
    return _manager if _manager is not None else load_plugins()


def hook() -> pluggy.HookRelay:
    """The hook relay of the process's plugin manager (``hook().graft_step_begin(step=1)``)."""
    return get_plugin_manager().hook
