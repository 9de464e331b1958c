"""The plugin's table of contents: a config section, the ``calculator`` environment and its
reward. Cheap to import (Graft imports it for every command)."""

from __future__ import annotations

from typing import Any

from graft import hookimpl
from graft_calculator.config import CalculatorConfig


@hookimpl
def graft_config_sections() -> list[tuple[str, type]]:
    """``features.calculator`` (`graft_calculator.config.CalculatorConfig`)."""
    return [("calculator", CalculatorConfig)]


@hookimpl
def graft_environments() -> dict[str, Any]:
    """``calculator``: the ``calculator`` tool in the chat template's format
    (`graft_calculator.environment.CalculatorTools`), or ``<calc>expr</calc>`` answered by
    ``<result>value</result>`` (``features.calculator.format=calc``)."""
    from graft_calculator.environment import calculator_factory

    return {"calculator": calculator_factory}


@hookimpl
def graft_reward_functions() -> dict[str, Any]:
    """``calculator``: 1.0 for the right final answer; ``algorithm.reward=auto`` picks it for
    the problems' ``data_source`` (``graft/calculator``)."""
    from graft.rl import RewardFunction
    from graft_calculator.problems import DATA_SOURCE
    from graft_calculator.reward import calculator_reward

    return {"calculator": RewardFunction(calculator_reward, data_sources=(DATA_SOURCE,))}
