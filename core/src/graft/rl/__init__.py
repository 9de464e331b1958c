"""Reinforcement learning: rewards, advantages, KL penalty and the RL step.

Public: `AdvantageEstimator` (what a ``graft_advantage_estimators`` plugin returns),
`RewardFunction` (what a ``graft_reward_functions`` plugin may return: the function, the
``data_source`` values it scores, where it wants to run), and what a ``graft_reward_executor``
plugin builds on: the `RewardExecutor` protocol, its `RewardBatchResult` and `RewardFailure`,
`run_reward` (one reward called), `reward_name` and `debug_trace` (for messages) and the core's
own executor, `InlineRewards`; what a ``graft_experience_source`` plugin supplies, `Experience`
through the `ExperienceSource` protocol, `merge_experiences` (several in one: a source that
collects in rounds) and `sample_seed` (each sample's own seed); what a ``graft_batch_shaper``
plugin returns, the `BatchShaper` protocol, with `last_model_turn` and `is_truncated` (a
response cut at ``rollout.max_new_tokens``); `RLJob` (the RL step: `RLJob.collect`,
`RLJob.train_on`, and `RLJob.for_rollouts` for a plugin's rollout workers). Importing the
package is cheap (no torch).
"""

from graft.lazy import lazy_attributes
from graft.rl.advantages import AdvantageEstimator
from graft.rl.experience import (
    BatchShaper,
    Experience,
    ExperienceSource,
    is_truncated,
    last_model_turn,
    merge_experiences,
    sample_seed,
)
from graft.rl.reward_executor import (
    InlineRewards,
    RewardBatchResult,
    RewardExecutor,
    RewardFailure,
    debug_trace,
    reward_name,
    run_reward,
)
from graft.rl.rewards import RewardFunction

__all__ = ["AdvantageEstimator", "BatchShaper", "Experience", "ExperienceSource",
           "InlineRewards", "RewardBatchResult", "RewardExecutor", "RewardFailure",
           "RewardFunction", "debug_trace", "is_truncated", "last_model_turn",
           "merge_experiences", "reward_name", "run_reward", "sample_seed", "RLJob"]

# the RL step imports torch: loaded on first use
__getattr__ = lazy_attributes(__name__, {"RLJob": "graft.rl.job"})
