"""pytest plugin (entry point ``pytest11``): the ``graft_plugin`` fixture for plugin authors."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack

import pytest

from graft.plugins import GraftPluginManager


@pytest.fixture
def graft_plugin() -> Iterator[Callable[..., GraftPluginManager]]:
    """Register plugins in this process for one test: ``graft_plugin(MyPlugin(), name="x")``.

    Returns the process's plugin manager; every plugin registered through it is unregistered
    when the test ends, so tests do not leak hooks into each other. A plugin already loaded
    under ``name`` (the installed copy of the plugin under test) is replaced for the test and
    restored after it.
    """
    from graft.testing import registered_plugin

    with ExitStack() as stack:

        def register(plugin: object, name: str | None = None) -> GraftPluginManager:
            return stack.enter_context(registered_plugin(plugin, name))

        yield register
