"""The reward registry (core and plugins) and the choice ``algorithm.reward=auto`` makes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from graft.data.tasks import TASKS, TextSample
from graft.errors import PluginError
from graft.plugins import GraftPluginManager, get_plugin_manager

RewardFn = Callable[[str, TextSample], float]


def reward_functions(manager: GraftPluginManager | None = None) -> dict[str, RewardFn]:
    """Every reward by name; two providers of one name is a `PluginError` naming both."""
    manager = manager or get_plugin_manager()
    found: dict[str, RewardFn] = {}
    owner: dict[str, str] = {}
    for impl in manager.hook.graft_reward_functions.get_hookimpls():
        for name, fn in (impl.function() or {}).items():
            if name in owner:
                raise PluginError(f"plugins {owner[name]!r} and {impl.plugin_name!r} both declare "
                                  f"the reward {name!r}")
            owner[name], found[name] = impl.plugin_name, fn
    return found


def reward_names(manager: GraftPluginManager | None = None) -> list[str]:
    """Names valid for ``algorithm.reward`` (besides ``auto``)."""
    return sorted(reward_functions(manager))


def resolve_reward(name: str, data_source: str) -> RewardFn:
    """``auto``: the synthetic task's own reward, else exact match against the answer column."""
    if name == "auto":
        return TASKS[data_source].reward if data_source in TASKS else reward_functions()["exact_match"]
    return reward_functions()[name]


def score(samples: list[Any], texts: list[TextSample], responses: list[str],
          reward: RewardFn) -> list[float]:
    """The reward of every response."""
    return [float(reward(response, text)) for response, text in zip(responses, texts, strict=True)]
