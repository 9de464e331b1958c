"""``engine.max_tokens_per_micro_batch`` left at its default holds the longest sample a step can
have (found on an H100: a 4,096-token rollout of a 14B model ran, then the update stopped on
the default budget of 4,096); a budget the user set stays as set."""

from __future__ import annotations

from graft.config import compose


def budget(*overrides: str) -> int:
    return compose(list(overrides)).engine.max_tokens_per_micro_batch


def test_the_default_budget_grows_to_the_longest_prompt_and_response() -> None:
    assert budget() == 4096  # 256 + 8 fit: the default as it was
    assert budget("rollout.max_new_tokens=4096") == 256 + 4096
    assert budget("rollout.max_new_tokens=4096", "data.max_prompt_tokens=64") == 64 + 4096
    assert budget("trainer.mode=sft", "data.max_response_tokens=8000") == 256 + 8000
    assert budget("trainer.mode=sft", "rollout.max_new_tokens=9000") == 4096  # RL's cap only


def test_a_budget_the_user_set_stays() -> None:
    assert budget("rollout.max_new_tokens=4096", "engine.max_tokens_per_micro_batch=1024") == 1024
    assert budget("engine.max_tokens_per_micro_batch=96") == 96
