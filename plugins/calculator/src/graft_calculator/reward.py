"""The ``calculator`` reward: 1.0 when an episode's final answer equals the problem's.

The final answer is the last number the model wrote after the tool's last result (the
environment's ``<result>`` or ``<tool_response>`` text is not the model's answer), or in the
whole response when it called no tool.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
RESULT_ENDS = ("</result>", "</tool_response>")  # the calc format's, Hermes templates'


def final_answer(response: str) -> str | None:
    """The last number after the last ``</result>`` or ``</tool_response>`` (anywhere without
    one), or None."""
    tail = response
    for end in RESULT_ENDS:
        tail = tail.rsplit(end, 1)[-1]
    numbers = NUMBER.findall(tail)
    return numbers[-1] if numbers else None


def calculator_reward(response: str, sample: Any) -> float:
    """1.0 when the final answer equals ``sample.answer`` as a number, else 0.0."""
    answer = final_answer(response)
    if answer is None or sample.answer is None:
        return 0.0
    try:
        return 1.0 if Fraction(answer) == Fraction(str(sample.answer).strip()) else 0.0
    except (ValueError, ZeroDivisionError):
        return 0.0
