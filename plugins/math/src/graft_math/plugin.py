"""The plugin's table of contents: a config section and one reward. No sympy or math-verify
here: Graft imports this module for every command."""

from __future__ import annotations

from typing import Any

from graft import hookimpl
from graft_math.config import MathConfig
from graft_math.sources import DATA_SOURCES


@hookimpl
def graft_config_sections() -> list[tuple[str, type]]:
    """``features.math`` (`graft_math.config.MathConfig`)."""
    return [("math", MathConfig)]


@hookimpl
def graft_reward_functions() -> dict[str, Any]:
    """``math``: 1.0 when the response's answer equals the ground truth (math-verify), else
    0.0; chosen by ``algorithm.reward=math``, or by ``auto`` for the `DATA_SOURCES`. Runs in
    worker processes (sympy is CPU-bound, and math-verify's timeouts need a main thread)."""
    from graft.rl import RewardFunction
    from graft_math.reward import math_reward

    return {"math": RewardFunction(math_reward, data_sources=DATA_SOURCES, pool="process",
                                   preload=("math_verify",))}
