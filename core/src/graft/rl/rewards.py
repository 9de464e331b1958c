"""The reward registry (core and plugins) and the choice ``algorithm.reward=auto`` makes."""

from __future__ import annotations

from collections.abc import Callable

from graft.data.tasks import TASKS, TextSample
from graft.plugins import GraftPluginManager, get_plugin_manager
from graft.plugins.registry import collect_named

RewardFn = Callable[[str, TextSample], float]


def reward_functions(manager: GraftPluginManager | None = None) -> dict[str, RewardFn]:
    """Every reward by name; two providers of one name is a `PluginError` naming both."""
    manager = manager or get_plugin_manager()
    return collect_named(manager, "graft_reward_functions", "reward")


def reward_names(manager: GraftPluginManager | None = None) -> list[str]:
    """Names valid for ``algorithm.reward`` (besides ``auto``)."""
    return sorted(reward_functions(manager))


def resolve_reward(name: str, data_source: str) -> RewardFn:
    """``auto``: the synthetic task's own reward, else exact match against the answer column."""
    if name == "auto":
        return TASKS[data_source].reward if data_source in TASKS else reward_functions()["exact_match"]
    return reward_functions()[name]
