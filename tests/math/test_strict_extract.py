"""The math reward's default answer extraction is strict (one answer: GSM8K's ####, the last
\\boxed{}, what follows the last answer marker, or a response that is one number), so a list of
numbers that holds the ground truth scores 0; extract=any keeps math-verify's every candidate."""

from __future__ import annotations

import pytest

from graft.config import compose
from graft.data.tasks import TextSample
from graft_math.reward import math_reward

STRICT, ANY = compose([]), compose(["features.math.extract=any"])
COUNTING = " ".join(str(n) for n in range(1, 15))  # "1 2 3 ... 14"


def score(response: str, answer: str, cfg=STRICT) -> float:
    return math_reward(response, TextSample("q", "", answer, origin="t.jsonl, line 1"), cfg)


def test_the_default_is_strict() -> None:
    assert STRICT.features.math.extract == "strict"


def test_a_list_of_numbers_holding_the_answer_scores_zero_unless_extract_is_any() -> None:
    assert score(COUNTING, "14") == 0.0
    assert score(COUNTING, "14", ANY) == 1.0


@pytest.mark.parametrize(("response", "answer"), [
    ("So the answer is \\boxed{14}.", "14"),
    ("\\boxed{13}, no: \\boxed{14}", "14"),  # the last boxed answer
    ("Natalia sold 48 + 24 = 72 clips.\n#### 72", "72"),
    ("The answer is 14, since 1 2 3", "14"),
    ("Final answer: $\\frac{1}{2}$", "0.5"),
    ("The answer is $18.", "18"),  # a currency sign
    ("The answer is x + 1", "1 + x"),
    ("14", "14"),
    ("1,000.", "1000"),
])
def test_the_one_answer_of_a_response_is_scored(response: str, answer: str) -> None:
    assert score(response, answer) == 1.0


@pytest.mark.parametrize(("response", "answer"), [
    ("\\boxed{14} or \\boxed{13}", "14"),  # the last boxed answer is wrong
    ("The answer is 13. No, 14", "14"),  # what follows the marker is wrong
    ("answer: 1, answer: 2 3 14", "14"),  # the last marker counts
    ("I think it is 14", "14"),  # no marker, no boxed answer, not one number
    ("14 or 15", "14"),
])
def test_other_numbers_in_a_response_do_not_count(response: str, answer: str) -> None:
    assert score(response, answer) == 0.0
