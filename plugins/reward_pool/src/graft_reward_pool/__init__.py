"""graft-reward-pool: Graft's rewards run in a pool of threads or processes, each sample within a
time limit (entry point ``reward_pool``, section ``features.reward_pool``, `RewardPoolConfig`).

- `graft_reward_pool.plugin`: where the plugin touches Graft's core (its section and
  ``graft_reward_executor``);
- `graft_reward_pool.executor`: `PoolExecutor`, the `graft.rl.RewardExecutor` the scorer uses
  (each reward in the pool it declares or ``kind`` names; ``reward_timeouts``);
- `graft_reward_pool.pool`: `RewardPool`, one pool of threads or processes, each sample within
  the time limit;
- `graft_reward_pool.workers`: its workers (daemon threads; Python processes that run each
  reward in their main thread).

Importing this package is cheap (no torch).
"""

from graft_reward_pool.config import RewardPoolConfig
from graft_reward_pool.executor import PoolExecutor
from graft_reward_pool.pool import QUEUE_DEPTH, PoolResult, RewardPool

__version__ = "0.1.0"

__all__ = ["QUEUE_DEPTH", "PoolExecutor", "PoolResult", "RewardPool", "RewardPoolConfig",
           "__version__"]
