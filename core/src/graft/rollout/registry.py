"""The rollout-engine registry (core and plugins) and building the configured engine."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from graft.plugins import GraftPluginManager, get_plugin_manager
from graft.plugins.keywords import call_with_keywords
from graft.plugins.registry import collect_named
from graft.rollout.types import RolloutEngine

if TYPE_CHECKING:
    from graft.config.schema import GraftConfig


def rollout_engines(manager: GraftPluginManager | None = None) -> dict[str, Callable[..., Any]]:
    """Every rollout-engine factory by name; two providers of one name is a `PluginError`."""
    return collect_named(manager or get_plugin_manager(), "graft_rollout_engines",
                         "rollout engine")


def build_rollout(*, cfg: GraftConfig, engine: Any, env: Any, run_dir: Path,
                  tokenizer: Any) -> RolloutEngine:
    """The engine ``cfg.rollout.engine`` names, built by its factory (with the keywords it
    takes; ``cfg``, the root config, is passed on whole)."""
    factory = rollout_engines()[cfg.rollout.engine]
    return call_with_keywords(factory, cfg=cfg, engine=engine, env=env, run_dir=run_dir,
                              tokenizer=tokenizer)


def environments(manager: GraftPluginManager | None = None) -> dict[str, Callable[..., Any]]:
    """Every environment factory by name (``graft_environments``); two providers of one name
    is a `PluginError`."""
    return collect_named(manager or get_plugin_manager(), "graft_environments", "environment")


def build_episode_runner(*, cfg: GraftConfig, tokenizer: Any, env: Any) -> Any:
    """The `graft.rollout.episodes.EpisodeRunner` of ``cfg.rollout.environment``, or None for
    ``none`` (one response per prompt); the environment's factory gets the root config ``cfg``."""
    rollout = cfg.rollout
    if rollout.environment == "none":
        return None
    from graft.engine.distributed.env import all_reduce
    from graft.rollout.episodes import EpisodeLimits, EpisodeRunner

    def busiest(count: int) -> int:
        """The largest count of active episodes over the data-parallel ranks."""
        import torch

        if env is None:
            return count
        return int(all_reduce(torch.tensor([count], device=env.device),
                              op=torch.distributed.ReduceOp.MAX).item())

    def sum_over_ranks(totals: Any) -> Any:
        """``totals`` summed over the data-parallel ranks."""
        if env is None:
            return totals
        return all_reduce(totals.to(env.device), group=env.dp_group).cpu()

    limits = EpisodeLimits(rollout.max_turns, rollout.max_episode_tokens, rollout.env_timeout_s)
    return EpisodeRunner(environments()[rollout.environment], tokenizer=tokenizer,
                         limits=limits, cfg=cfg, active_episodes=busiest,
                         sum_over_ranks=sum_over_ranks,
                         ranks=env.dp_size if env is not None else 1)
