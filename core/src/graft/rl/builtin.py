"""RL's hooks, registered as a built-in plugin: the ``rl`` trainer mode, the core's reward
functions and advantage estimators, their config registries and rules (no heavy imports: torch
loads when an estimator runs)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from graft.errors import ConfigError
from graft.hookspecs import hookimpl
from graft.plugins.registry import registry_names

if TYPE_CHECKING:
    from graft.config.schema import GraftConfig


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
    """``rewards``, ``advantage_estimators`` and ``rollout_corrections``."""
    return {"rewards": registry_names("graft_reward_functions", "reward"),
            "advantage_estimators": registry_names("graft_advantage_estimators",
                                                   "advantage estimator"),
            "rollout_corrections": registry_names("graft_rollout_corrections",
                                                  "rollout correction")}


@hookimpl
def graft_config_rules() -> list[Any]:
    """Group estimators need groups (`graft.rl.advantages.group_estimator_needs_groups`); a
    rollout correction's settings must agree (`check_rollout_correction`)."""
    from graft.rl.advantages import group_estimator_needs_groups

    return [group_estimator_needs_groups, check_rollout_correction]


def check_rollout_correction(*, cfg: GraftConfig) -> None:
    """`ConfigError` for an empty IcePop range (``algorithm.icepop_low >= icepop_high``)."""
    algorithm = cfg.algorithm
    if algorithm.rollout_correction == "icepop" and algorithm.icepop_low >= algorithm.icepop_high:
        raise ConfigError(f"algorithm.icepop_low={algorithm.icepop_low} must be below "
                          f"algorithm.icepop_high={algorithm.icepop_high} (every token would be "
                          f"masked)")


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


@hookimpl
def graft_rollout_corrections() -> dict[str, Any]:
    """``tis``, ``mis``, ``seq_mis`` and ``icepop`` (`graft.rl.corrections`)."""
    from graft.rl.corrections import icepop, mis, seq_mis, tis

    return {"tis": tis, "mis": mis, "seq_mis": seq_mis, "icepop": icepop}
