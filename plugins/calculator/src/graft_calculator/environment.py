"""The calculator environment, in two formats (``features.calculator.format``):

* `CalculatorTools` (``auto``, the default, with a tokenizer that has a chat template;
  ``hermes``, ``harmony``, ``llama3``): the tool
  `calculator` as a typed function in the model's own format (`graft_multiturn.tools`): the
  prompt is chat messages rendered with the tool list, the model calls
  ``<tool_call>{"name": "calculator", "arguments": {"expression": "12*7"}}</tool_call>``, the
  result goes back as a ``tool`` message through the chat template.
* `CalculatorEnvironment` (``calc``, and ``auto`` without a chat template):
  ``<calc>expr</calc>`` answered by ``<result>value</result>`` in the raw token sequence (any
  tokenizer).

Either way a turn ends right after its call (`graft_multiturn.Environment`'s ``stop``), so the
model never writes past its own call, and a turn without a call is the final answer. The
environment leaves the final answer to the reward registry (the ``calculator`` reward,
`graft_calculator.reward`); it rewards only well-formed calls, and only with
``features.calculator.call_reward``. An expression that is not arithmetic, like a call that
does not parse, is a `graft_multiturn.MalformedAction`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from graft_multiturn import MalformedAction
from graft_multiturn.tools import ToolCall, ToolEnvironment

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


def calculator(expression: Annotated[str, "numbers, + - * / // % ** and parentheses"]) -> str:
    """Evaluate an arithmetic expression exactly."""
    try:
        return render(evaluate(expression))
    except NotArithmetic as exc:
        raise MalformedAction(f"calculator({expression!r}): {exc}") from exc


class CalculatorTools(ToolEnvironment):
    """One episode with the `calculator` tool in the chat template's format: the sample's
    prompt as a user message, one call per turn (a turn ends at the format's end of call)."""

    def __init__(self, *, tokenizer: Any, tool_format: str = "hermes", max_calls: int = 3,
                 call_reward: float = 0.0) -> None:
        super().__init__([calculator], tokenizer=tokenizer, tool_format=tool_format,
                         max_calls=max_calls, stop_after_call=True)
        self.call_reward = call_reward

    def reward(self, calls: list[ToolCall], results: list[str]) -> float | None:
        """``call_reward`` for the episode's first turn with calls that evaluate (shaping:
        repeated calls must not outweigh the answer)."""
        return (self.call_reward or None) if self.calls == len(calls) else None


def calculator_factory(*, cfg: Any = None, tokenizer: Any = None) -> Any:
    """A fresh environment for one episode, set by ``features.calculator`` (its ``format``:
    `CalculatorTools`, or `CalculatorEnvironment` for ``calc`` and for ``auto`` with a
    tokenizer that has no chat template)."""
    section = getattr(getattr(cfg, "features", None), "calculator", None)
    if section is None:
        return CalculatorEnvironment()
    templated = bool(getattr(tokenizer, "chat_template", None))
    if section.format == "calc" or (section.format == "auto" and not templated):
        return CalculatorEnvironment(max_calls=section.max_calls, call_reward=section.call_reward)
    if not templated:
        raise ValueError(f"features.calculator.format={section.format} needs a tokenizer with a "
                         f"chat template (the model's tool-call format); set "
                         f"features.calculator.format=calc for <calc>expr</calc> on any "
                         f"tokenizer")
    return CalculatorTools(tokenizer=tokenizer, tool_format=section.format,
                           max_calls=section.max_calls, call_reward=section.call_reward)
