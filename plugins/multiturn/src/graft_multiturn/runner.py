"""The environments registry (``graft_environments``) and the episode runner a run's
``features.multiturn`` asks for."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from graft.plugins import GraftPluginManager, collect_named, get_plugin_manager

if TYPE_CHECKING:
    from graft.config import GraftConfig
    from graft_multiturn.episodes import EpisodeRunner


def environments(manager: GraftPluginManager | None = None) -> dict[str, Callable[..., Any]]:
    """Every environment factory by name (``graft_environments``); two providers of one name
    is a `graft.errors.PluginError`."""
    return collect_named(manager or get_plugin_manager(), "graft_environments", "environment")


def build_episode_runner(*, cfg: GraftConfig, tokenizer: Any, env: Any) -> EpisodeRunner | None:
    """The `graft_multiturn.EpisodeRunner` of ``features.multiturn.environment``, or None for
    ``none`` (one response per prompt); the environment's factory gets the root config ``cfg``.
    ``env`` is the run's `graft.engine.DistEnv` (None: one process)."""
    section = cfg.features.multiturn
    if section.environment == "none":
        return None
    from graft_multiturn.episodes import EpisodeLimits, EpisodeRunner

    def busiest(count: int) -> int:
        """The largest count of active episodes over the data-parallel ranks."""
        import torch

        if env is None:
            return count
        return int(_all_reduce(torch.tensor([count], device=env.device),
                               op=torch.distributed.ReduceOp.MAX, group=env.group).item())

    def sum_over_ranks(totals: Any) -> Any:
        """``totals`` summed over the data-parallel ranks."""
        if env is None:
            return totals
        return _all_reduce(totals.to(env.device), group=env.dp_group).cpu()

    limits = EpisodeLimits(section.max_turns, section.max_episode_tokens, section.env_timeout_s)
    return EpisodeRunner(environments()[section.environment], tokenizer=tokenizer,
                         limits=limits, cfg=cfg, active_episodes=busiest,
                         sum_over_ranks=sum_over_ranks,
                         ranks=env.dp_size if env is not None else 1)


def _all_reduce(value: Any, op: Any = None, group: Any = None) -> Any:
    """In-place all-reduce of the tensor ``value`` over ``group`` (default: all ranks; sum
    unless ``op``; a no-op on one rank); returns ``value``."""
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(value, op=dist.ReduceOp.SUM if op is None else op, group=group)
    return value
