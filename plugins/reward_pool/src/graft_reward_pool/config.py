"""The ``features.reward_pool`` config section (no torch: imported by every command)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from graft.config import bounded, choice

SECTION = "reward_pool"


@dataclass
class RewardPoolConfig:
    """``features.reward_pool``: rewards run in a pool of threads or processes per rank, each
    sample within a time limit (until graft-reward-pool, the core's ``algorithm.reward_pool``,
    ``algorithm.reward_workers`` and ``algorithm.reward_timeout_s``)."""

    # thread, process (CPU-bound Python such as sympy; a sample past the timeout is killed), or
    # auto = what each reward declares (graft-math: process; the core's rewards: thread).
    kind: str = choice("auto", ("auto", "thread", "process"))
    # Rewards run in a pool of this many workers per rank.
    workers: int = bounded(4, ge=1)
    # Seconds one sample's reward may take; past it the sample scores 0 (reward_timeouts).
    timeout_s: float = bounded(10.0, gt=0.0)


def reward_pool_section(cfg: Any) -> RewardPoolConfig:
    """``cfg.features.reward_pool`` of ``cfg`` (the root config), or the defaults for a config
    composed without this plugin's section."""
    section = getattr(getattr(cfg, "features", None), SECTION, None)
    return RewardPoolConfig() if section is None else section
