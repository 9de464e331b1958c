"""``graft train`` with graft-dapo on one and two gloo ranks: dynamic sampling and the overlong
penalty choose the same groups whatever the layout; a step that keeps nothing trains on masked
padding (moved from tests/core/rl/test_batch_shaping.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

RUN = ("trainer.total_steps=2", "rollout.prompts_per_step=4", "rollout.n=4",
       "rollout.max_new_tokens=48", "rollout.seeded_sampling=true", "export.hf_at_end=false",
       "features.dapo.dynamic_sampling=true", "features.dapo.max_sampling_rounds=3",
       "features.dapo.overlong=penalty", "features.dapo.overlong_buffer=16")
SHAPING = ("dynamic_sampling/", "overlong/")


@pytest.mark.slow
def test_a_run_with_dynamic_sampling_and_the_penalty_is_the_same_on_two_ranks(
        graft_train, metrics_of, tmp_path: Path) -> None:
    # seeded sampling keys each sample by its prompt: the ranks agree on every round, and the
    # step trains on the same groups whatever the layout
    graft_train(tmp_path / "one", *RUN)
    graft_train(tmp_path / "two", *RUN, nproc=2)
    one, two = metrics_of(tmp_path / "one"), metrics_of(tmp_path / "two")
    for a, b in zip(one, two, strict=True):
        shaped = {k: v for k, v in a.items() if k.startswith(SHAPING)}
        assert shaped == {k: v for k, v in b.items() if k.startswith(SHAPING)}
        assert 1 <= a["dynamic_sampling/rounds"] <= 3
        assert a["dynamic_sampling/generated_groups"] == 4 * a["dynamic_sampling/rounds"]
        assert a["overlong/penalty_mean"] < 0 and a["reward_mean"] == b["reward_mean"]
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)


@pytest.mark.slow
def test_a_run_that_keeps_nothing_trains_on_masked_padding(graft_train, metrics_of,
                                                           tmp_path: Path) -> None:
    # exact_match on the random model: every reward 0, every group flat, every round dropped;
    # the filter's truncation count is read before the masks
    graft_train(tmp_path, "trainer.total_steps=1", "rollout.prompts_per_step=4", "rollout.n=4",
                "rollout.max_new_tokens=48", "export.hf_at_end=false",
                "algorithm.reward=exact_match", "features.dapo.dynamic_sampling=true",
                "features.dapo.max_sampling_rounds=2", "features.dapo.overlong=filter")
    (row,) = metrics_of(tmp_path)
    assert row["dynamic_sampling/rounds"] == 2 and row["dynamic_sampling/kept_groups"] == 0
    assert row["dynamic_sampling/padded_groups"] == 1
    assert row["loss"] == 0.0 and row["grad_norm"] == 0.0, "no token is trained on"
    assert row["overlong/filtered"] == row["response_truncated_fraction"] * 4
