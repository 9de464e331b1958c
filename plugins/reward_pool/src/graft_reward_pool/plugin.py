"""graft-reward-pool's hooks (no torch here: Graft imports this module for every command): its
config section (the old ``algorithm.*`` keys are moved keys, in the core's table), and the
executor that runs an RL run's rewards in its pools."""

from __future__ import annotations

from typing import Any

from graft import hookimpl
from graft_reward_pool.config import SECTION, RewardPoolConfig


@hookimpl
def graft_config_sections() -> list[tuple[str, type]]:
    """``features.reward_pool`` (`RewardPoolConfig`)."""
    return [(SECTION, RewardPoolConfig)]


@hookimpl
def graft_reward_executor(cfg: Any) -> Any:
    """A `graft_reward_pool.PoolExecutor` for ``cfg`` (the root config): its pools start on
    first use or when the scorer starts them."""
    from graft_reward_pool.executor import PoolExecutor

    return PoolExecutor(cfg=cfg)
