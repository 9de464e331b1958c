"""A pathological answer never stalls a step: math-verify's own timeouts end it in a process
worker's main thread, and where they cannot (a sympy call that holds the interpreter), the pool
kills the worker at features.reward_pool.timeout_s and the sample scores 0."""

from __future__ import annotations

from graft.config import compose
from graft.data.tasks import TextSample
from graft.rl.rewards import RewardScorer

# Comparing 10^(10^10) with 1 runs sympy for minutes in C code (no signal reaches it sooner
# than math-verify's alarm; a thread could not even be interrupted).
HUGE = "The answer is \\boxed{10^{10^{10}}}."


def scores(*overrides: str) -> tuple[list[float], list[float], dict[str, float]]:
    scorer = RewardScorer(cfg=compose(["algorithm.reward=math", "features.reward_pool.workers=2",
                                       *overrides]))
    samples = [TextSample("q", "", "1", origin="row 1"), TextSample("q", "", "72")]
    try:
        first = scorer.score([HUGE, "\\boxed{72}"], samples)
        metrics = scorer.metrics()
        again = scorer.score(["\\boxed{1}", "\\boxed{72}"], samples)  # the pool still works
    finally:
        scorer.close()
    return first, again, metrics


def test_math_verifys_own_timeout_ends_a_pathological_comparison() -> None:
    first, again, metrics = scores("features.math.parse_timeout_s=1",
                                   "features.reward_pool.timeout_s=600")
    assert first == [0.0, 1.0] and metrics == {"reward_timeouts": 0.0, "reward_errors": 0.0}
    assert again == [1.0, 1.0]


def test_the_pool_kills_a_sample_past_the_reward_timeout() -> None:
    first, again, metrics = scores("features.math.parse_timeout_s=600",
                                   "features.reward_pool.timeout_s=3")
    assert first == [0.0, 1.0] and metrics == {"reward_timeouts": 1.0, "reward_errors": 0.0}
    assert again == [1.0, 1.0]
