"""RL's hooks, registered as a built-in plugin: the ``rl`` trainer mode, the core's reward
functions and advantage estimators, their config registries and rules (no heavy imports: torch
loads when an estimator runs)."""

from __future__ import annotations

from typing import Any

from graft.hookspecs import hookimpl
from graft.plugins.registry import registry_names


def rl_job_class() -> type:
    """`graft.rl.job.RLJob`: generate, score, update, push weights to the generator, repeat."""
    from graft.rl.job import RLJob

    return RLJob


@hookimpl
def graft_trainer_modes() -> dict[str, Any]:
    """``rl``: the trainer mode of this package."""
    from graft.data.sampler import batch_checked_job

    return {"rl": batch_checked_job(rl_job_class, batch_key="rollout.prompts_per_step",
                                    what="prompts")}


@hookimpl
def graft_config_choices() -> dict[str, Any]:
    """``rewards`` and ``advantage_estimators``."""
    return {"rewards": registry_names("graft_reward_functions", "reward"),
            "advantage_estimators": registry_names("graft_advantage_estimators",
                                                   "advantage estimator")}


@hookimpl
def graft_config_rules() -> list[Any]:
    """Group estimators need groups (`graft.rl.advantages.group_estimator_needs_groups`)."""
    from graft.rl.advantages import group_estimator_needs_groups

    return [group_estimator_needs_groups]


@hookimpl
def graft_reward_functions() -> dict[str, Any]:
    """``exact_match`` (response equals the answer) and ``positional_match`` (partial credit)."""
    from graft.data.tasks import exact_match_reward, positional_match_reward

    return {"exact_match": exact_match_reward, "positional_match": positional_match_reward}


@hookimpl
def graft_advantage_estimators() -> dict[str, Any]:
    """``grpo`` (Dr. GRPO with ``algorithm.norm_adv_by_std=false``) and ``rloo``; both need
    groups of at least 2 samples."""
    from graft.rl.advantages import AdvantageEstimator, grpo, rloo

    return {"grpo": AdvantageEstimator(grpo, min_group_size=2),
            "rloo": AdvantageEstimator(rloo, min_group_size=2)}
