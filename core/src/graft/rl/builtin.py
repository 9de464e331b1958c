"""The core's reward functions, registered as a built-in plugin (no heavy imports)."""

from __future__ import annotations

from typing import Any

from graft.hookspecs import hookimpl


@hookimpl
def graft_reward_functions() -> dict[str, Any]:
    """``exact_match`` (response equals the answer) and ``positional_match`` (partial credit)."""
    from graft.data.tasks import exact_match_reward, positional_match_reward

    return {"exact_match": exact_match_reward, "positional_match": positional_match_reward}
