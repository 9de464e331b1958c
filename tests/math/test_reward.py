"""The math reward with math-verify: boxed, GSM8K and plain answers, equivalent forms equal,
a missing ground truth named, and math-verify's signal timeouts only where they work."""

from __future__ import annotations

import threading

import pytest

from graft.config import compose
from graft.data.tasks import TextSample
from graft.errors import DataError
from graft_math.reward import gsm8k_answer, math_reward

CFG = compose([])
BOXED = compose(["features.math.extract=boxed"])


def score(response: str, answer: str | None, cfg=CFG) -> float:
    return math_reward(response, TextSample("q", "", answer, origin="t.parquet, row 4"), cfg)


@pytest.mark.parametrize(("response", "answer"), [
    ("So she has \\boxed{72} apples.", "72"),
    ("Natalia sold 48 + 24 = 72 clips.\n#### 72", "72"),
    ("The answer is 72.", "72"),
    ("#### 1,000", "1000"),
    ("\\boxed{0.5}", "\\frac{1}{2}"),
    ("$\\frac{2}{4}$", "0.5"),
    ("\\boxed{\\sqrt{18}}", "3\\sqrt{2}"),
    ("\\boxed{\\frac{1}{2}}", "She sold half ... #### 0.5"),  # a full GSM8K solution as truth
    ("\\boxed{x + 1}", "1 + x"),
])
def test_equivalent_answers_score_one(response: str, answer: str) -> None:
    assert score(response, answer) == 1.0


@pytest.mark.parametrize(("response", "answer"), [
    ("\\boxed{71}", "72"),
    ("#### 71", "72"),
    ("72 is wrong, #### 71", "72"),
    ("I do not know.", "72"),
    ("", "72"),
])
def test_wrong_or_missing_answers_score_zero(response: str, answer: str) -> None:
    assert score(response, answer) == 0.0


def test_boxed_extraction_accepts_only_boxed_answers() -> None:
    assert score("The answer is 72.", "72", BOXED) == 0.0
    assert score("First 70, so \\boxed{72}.", "72", BOXED) == 1.0


def test_gsm8k_answer() -> None:
    assert gsm8k_answer("a\n#### 1,234.") == "1234"
    assert gsm8k_answer("#### 3\n#### -5") == "-5"
    assert gsm8k_answer("no marker 42") is None


@pytest.mark.parametrize("answer", [None, "", "  "])
def test_a_missing_ground_truth_is_named(answer) -> None:
    with pytest.raises(DataError, match=r"^t.parquet, row 4 has no ground truth for the math "
                                        r"reward; set data.answer_key"):
        score("\\boxed{1}", answer)


def test_off_the_main_thread_it_runs_without_signal_timeouts() -> None:
    # math-verify's timeouts call signal.alarm, which raises off the main thread; the reward
    # turns them off there (the pool's own limit bounds the sample).
    results = []
    thread = threading.Thread(target=lambda: results.append(score("\\boxed{72}", "72")))
    thread.start()
    thread.join()
    assert results == [1.0]
