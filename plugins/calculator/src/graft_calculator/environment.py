"""The calculator environment: the model writes ``<calc>expr</calc>``, the tool answers
``<result>value</result>``; a turn without a call is the final answer.

A turn ends right after ``</calc>`` (`graft_multiturn.Environment`'s ``stop``), so the model
never writes past its own call. The environment leaves the final answer to the reward registry
(the ``calculator`` reward, `graft_calculator.reward`); it rewards only well-formed calls, and
only with ``features.calculator.call_reward``.
"""

from __future__ import annotations

import re
from typing import Any

from graft_multiturn import MalformedAction

from graft_calculator.arithmetic import NotArithmetic, evaluate, render

OPEN, CLOSE = "<calc>", "</calc>"
CALL = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.S)


def result_text(value: str) -> str:
    """What the tool appends after a call."""
    return f"<result>{value}</result>"


class CalculatorEnvironment:
    """One episode: prompts from the sample (None from `reset`), a calculator as the tool."""

    stop = (CLOSE,)

    def __init__(self, *, max_calls: int = 3, call_reward: float = 0.0) -> None:
        self.max_calls, self.call_reward = max_calls, call_reward
        self.calls = 0

    def reset(self, sample: Any) -> None:
        """The sample's own prompt (the problem), as the data loader encoded it."""
        self.calls = 0
        return None

    def step(self, action_ids: list[int], action_text: str) -> tuple[str | None, float | None,
                                                                       bool]:
        """The tool's result for a turn ending in a call; done (scored by the reward) for a
        turn without one, or with a call past ``max_calls``. An expression that is not
        arithmetic is a `MalformedAction` (the episode ends with reward 0)."""
        calls = CALL.findall(action_text)
        if not calls or self.calls >= self.max_calls:
            return None, None, True
        try:
            value = render(evaluate(calls[-1]))
        except NotArithmetic as exc:
            raise MalformedAction(f"{OPEN}{calls[-1]}{CLOSE}: {exc}") from exc
        self.calls += 1
        # shaping, once per episode: repeated calls must not outweigh the answer
        return result_text(value), (self.call_reward or None) if self.calls == 1 else None, False


def calculator_factory(*, cfg: Any = None) -> CalculatorEnvironment:
    """A fresh environment for one episode, set by ``features.calculator``."""
    section = getattr(getattr(cfg, "features", None), "calculator", None)
    if section is None:
        return CalculatorEnvironment()
    return CalculatorEnvironment(max_calls=section.max_calls, call_reward=section.call_reward)
