"""Advantage estimators: a registry (``graft_advantage_estimators``) with GRPO (optionally without
the std, Dr. GRPO) and RLOO built in.

Rewards come in groups of ``n`` samples of the same prompt, consecutive. Group statistics are
computed in float64 and a group whose rewards are all equal gets advantages of exactly 0 (a
reward such as 0.7 or 2/3 is not exact in float32, and dividing its rounding noise by a tiny
std would give advantages of ~0.06).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from graft.errors import ConfigError, PluginError
from graft.plugins import GraftPluginManager, get_plugin_manager
from graft.plugins.keywords import call_with_keywords
from graft.plugins.registry import collect_named

if TYPE_CHECKING:  # torch is imported where the math runs: config validation reads this module
    import torch

    from graft.config.schema import GraftConfig

EPS = 1e-6


@dataclass(frozen=True)
class AdvantageEstimator:
    """An advantage estimator: ``compute(rewards, *, group_size, cfg) -> advantages`` (``cfg``
    the root config) and the smallest group size (``rollout.n``) it gives a learning signal
    with (config validation rejects smaller ones)."""

    compute: Callable[..., torch.Tensor]
    min_group_size: int = 1


def _groups(rewards: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rewards as ``(groups, n)`` float64, centred on each group's mean, and a mask of the groups
    whose rewards are all equal (their advantages are exactly 0)."""
    import torch

    groups = rewards.double().reshape(-1, group_size)
    flat = groups.amax(dim=1, keepdim=True) == groups.amin(dim=1, keepdim=True)
    centred = torch.where(flat, 0.0, groups - groups.mean(dim=1, keepdim=True))
    return centred, groups


def grpo(rewards: torch.Tensor, *, group_size: int, cfg: GraftConfig) -> torch.Tensor:
    """``(r - mean_group) / (std_group + eps)``, or ``r - mean_group`` when
    ``algorithm.norm_adv_by_std`` is false (Dr. GRPO)."""
    centred, groups = _groups(rewards, group_size)
    if cfg.algorithm.norm_adv_by_std:
        centred = centred / (groups.std(dim=1, keepdim=True) + EPS)
    return centred.reshape(-1)


def rloo(rewards: torch.Tensor, *, group_size: int, cfg: GraftConfig) -> torch.Tensor:
    """``r - mean of the other n - 1 samples`` = ``n / (n - 1) * (r - mean_group)``."""
    centred, _ = _groups(rewards, group_size)
    return (centred * group_size / (group_size - 1)).reshape(-1)


def advantage_estimators(manager: GraftPluginManager | None = None
                         ) -> dict[str, AdvantageEstimator]:
    """Every estimator by name (plain functions wrapped with ``min_group_size=1``); two
    providers of one name is a `PluginError` naming both."""
    found = collect_named(manager or get_plugin_manager(), "graft_advantage_estimators",
                          "advantage estimator")
    return {name: value if isinstance(value, AdvantageEstimator) else AdvantageEstimator(value)
            for name, value in found.items()}


def group_estimator_needs_groups(*, cfg: GraftConfig, manager: GraftPluginManager) -> None:
    """A config rule (``graft_config_rules``: called with keywords, ``cfg`` the root config):
    ``rollout.n`` below the estimator's group size gives every sample advantage 0
    (`ConfigError`)."""
    if cfg.trainer.mode != "rl":
        return
    estimator = advantage_estimators(manager).get(cfg.algorithm.advantage)
    if estimator is not None and cfg.rollout.n < estimator.min_group_size:
        raise ConfigError(
            f"rollout.n={cfg.rollout.n} but algorithm.advantage={cfg.algorithm.advantage!r} "
            f"compares the samples of one prompt and needs rollout.n >= "
            f"{estimator.min_group_size} (with fewer every advantage is 0 and nothing is "
            f"learned); raise rollout.n")


def compute_advantages(estimator: AdvantageEstimator, rewards: torch.Tensor, *,
                       group_size: int, cfg: GraftConfig) -> torch.Tensor:
    """One float32 advantage per sample from ``estimator`` (rewards in consecutive groups).

    A reward or an advantage that is not finite is a `PluginError` naming the estimator and
    the samples (their positions in the step's batch): it must never reach the loss.
    """
    _check_finite("reward", rewards, estimator)
    out = call_with_keywords(estimator.compute, rewards=rewards.double(), group_size=group_size,
                             cfg=cfg).float()
    _check_finite("advantage", out, estimator)
    return out


def _check_finite(what: str, values: torch.Tensor, estimator: AdvantageEstimator) -> None:
    import torch

    bad = (~torch.isfinite(values)).nonzero().flatten().tolist()
    if bad:
        fn = estimator.compute
        name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)}"
        raise PluginError(f"the {what}s of {len(bad)} of {len(values)} samples of this step are "
                          f"not finite (sample {bad[0]}: {float(values[bad[0]])}; samples "
                          f"{bad[:8]}), so no update may use them (advantage estimator {name})")
