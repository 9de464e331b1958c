"""The core's reward functions and advantage estimators, registered as a built-in plugin (no
heavy imports: torch loads when an estimator runs)."""

from __future__ import annotations

from typing import Any

from graft.hookspecs import hookimpl


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
