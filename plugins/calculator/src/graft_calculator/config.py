"""``features.calculator``: the tool's tags and how many calls an episode may make."""

from __future__ import annotations

from dataclasses import dataclass

from graft.config import bounded


@dataclass
class CalculatorConfig:
    """The calculator environment's settings (``features.calculator``)."""

    # Tool calls one episode may make; a turn with another call past them ends the episode
    # (the final answer is then scored as it stands). features.multiturn.max_turns bounds the
    # turns.
    max_calls: int = bounded(3, ge=0)
    # Added to the episode's reward for its first call that evaluates (0: only the final
    # answer counts). Shaping for models that have never seen the tool; below the answer's 1.
    call_reward: float = bounded(0.0, ge=0.0)
