"""Reinforcement learning: rewards, advantages, KL penalty and the RL step.

Public: `AdvantageEstimator` (what a ``graft_advantage_estimators`` plugin returns) and
`RewardFunction` (what a ``graft_reward_functions`` plugin may return: the function, the
``data_source`` values it scores, whether it runs in threads or processes). Importing the
package is cheap (no torch).
"""

from graft.rl.advantages import AdvantageEstimator
from graft.rl.rewards import RewardFunction

__all__ = ["AdvantageEstimator", "RewardFunction"]
