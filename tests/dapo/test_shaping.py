"""graft-dapo's shaping (``features.dapo.dynamic_sampling``, ``features.dapo.overlong``): each
function on hand-computed batches, and the shaper's rounds and its choice of groups (on one
rank and on two simulated ranks). Moved from tests/core/rl/test_batch_shaping.py; the core's
`merge_experiences` and `is_truncated` are tested in tests/core/rl/test_batch_shaper_hook.py."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from graft.config import compose
from graft.rl import Experience, merge_experiences
from graft.rollout import RolloutSample
from graft_dapo import DapoShaper, flat_groups, overlong_penalty, plan_groups, take_groups

EOS = 2
CPU = SimpleNamespace(device=torch.device("cpu"), dp_group=None, dp_size=1, dp_rank=0)


def sample(length: int, *, eos: bool = False, mask: list[float] | None = None) -> RolloutSample:
    """A response of ``length`` tokens (token 7), ending with ``eos`` when asked."""
    response = [7] * (length - 1) + [EOS if eos else 7] if length else []
    return RolloutSample([1, 5], response, None,
                         loss_mask=None if mask is None else torch.tensor(mask))


def experience(rewards: list[float], prompts: list[int], *, length: int = 2,
               versions: list[int] | None = None) -> Experience:
    n = len(rewards) // len(prompts)
    return Experience(list(prompts), [f"p{p}" for p in prompts for _ in range(n)],
                      [sample(length, eos=True) for _ in rewards],
                      torch.tensor(rewards, dtype=torch.float64), 1.0, {"reward_errors": 1.0},
                      versions)


def test_overlong_penalty_is_zero_then_falls_linearly_over_the_buffer() -> None:
    # max 10 tokens, buffer 4: free up to 6 tokens, then -1/4 per token, -1 at 10 and beyond
    got = overlong_penalty([3, 6, 7, 8, 10, 12], max_new_tokens=10, buffer=4, penalty=1.0)
    assert got.dtype == torch.float64
    assert got.tolist() == [0.0, 0.0, -0.25, -0.5, -1.0, -1.0]
    half = overlong_penalty([9], max_new_tokens=10, buffer=4, penalty=0.5)
    assert half.tolist() == [-0.375]


def test_flat_groups_are_those_whose_rewards_are_all_equal() -> None:
    rewards = torch.tensor([1.0, 1, 1, 0, 1, 0, 0.5, 0.5, 0.5], dtype=torch.float64)
    assert flat_groups(rewards, 3) == [True, False, True]


def test_plan_keeps_the_first_kept_groups_and_pads_to_the_data_parallel_size() -> None:
    kept = [False, True, True, False, True, True, True]
    assert plan_groups(kept, batch=4, multiple=2) == ([1, 2, 4, 5], [])
    # one kept group on two ranks: the earliest dropped one pads it
    assert plan_groups([False, True, False, False], batch=4, multiple=2) == ([1], [0])
    assert plan_groups([False, True, True, True], batch=4, multiple=2) == ([1, 2, 3], [0])
    # nothing kept: one group per rank, all padding
    assert plan_groups([False] * 4, batch=4, multiple=2) == ([], [0, 1])


def test_take_keeps_prompts_samples_rewards_and_versions_together() -> None:
    one = experience([1, 1, 0, 1], [10, 11], versions=[3, 3, 4, 4])
    two = experience([0, 1, 5, 5], [12, 13], versions=[5, 5, 5, 6])
    picked = take_groups(merge_experiences([one, two]), [3, 1], 2)
    assert picked.prompt_indices == [13, 11]
    assert picked.rewards.tolist() == [5, 5, 0, 1]
    assert picked.texts == ["p13", "p13", "p11", "p11"]
    assert picked.policy_versions == [5, 6, 4, 4]


def shaper(*overrides: str, env: SimpleNamespace = CPU) -> DapoShaper:
    cfg = compose(["rollout.n=2", "rollout.prompts_per_step=2", "rollout.max_new_tokens=4",
                   *overrides])
    return DapoShaper(cfg, env, EOS)


def rounds_of(*parts: Experience):
    drawn = list(parts)
    return lambda: drawn.pop(0)


def test_dynamic_sampling_draws_until_the_batch_is_full_and_keeps_draw_order() -> None:
    # round 1: prompt 10 flat, 11 kept; round 2: 12 flat, 13 kept -> 2 groups: stop
    draw = rounds_of(experience([1, 1, 0, 1], [10, 11]), experience([0, 0, 1, 0], [12, 13]),
                     experience([0, 1, 0, 1], [14, 15]))
    got, metrics = shaper("features.dapo.dynamic_sampling=true").shape(draw, refill=True)
    assert got.prompt_indices == [11, 13]
    assert got.rewards.tolist() == [0, 1, 1, 0]
    assert all(s.loss_mask is None for s in got.samples)
    assert got.rollout_s == 2.0
    assert metrics == {"dynamic_sampling/rounds": 2.0, "dynamic_sampling/generated_groups": 4.0,
                       "dynamic_sampling/kept_groups": 2.0,
                       "dynamic_sampling/dropped_groups": 2.0,
                       "dynamic_sampling/padded_groups": 0.0,
                       "dynamic_sampling/reward_mean_generated": 4 / 8,
                       "response_truncated_fraction": 0.0}


def test_dynamic_sampling_trims_to_the_batch_and_stops_after_its_rounds() -> None:
    draw = rounds_of(experience([0, 1, 1, 0], [10, 11]))
    got, metrics = shaper("features.dapo.dynamic_sampling=true",
                          "rollout.prompts_per_step=1").shape(draw, refill=True)
    assert got.prompt_indices == [10] and metrics["dynamic_sampling/kept_groups"] == 2.0
    # two rounds, nothing kept: the first dropped group pads the batch, its loss masked
    draw = rounds_of(experience([1, 1, 0, 0], [10, 11]), experience([2, 2, 3, 3], [12, 13]))
    got, metrics = shaper("features.dapo.dynamic_sampling=true",
                          "features.dapo.max_sampling_rounds=2").shape(draw, refill=True)
    assert got.prompt_indices == [10]
    assert all(s.loss_mask.tolist() == [0.0, 0.0] for s in got.samples)
    assert metrics["dynamic_sampling/rounds"] == 2.0
    assert metrics["dynamic_sampling/padded_groups"] == 1.0
    # a plugin's source: shaped, never drawn again
    draw = rounds_of(experience([1, 1, 0, 1], [10, 11]), experience([0, 1, 0, 1], [12, 13]))
    got, metrics = shaper("features.dapo.dynamic_sampling=true").shape(draw, refill=False)
    assert got.prompt_indices == [11] and metrics["dynamic_sampling/rounds"] == 1.0


def test_two_ranks_train_the_first_kept_groups_in_draw_order_dealt_as_prompts_are() -> None:
    # prompts_per_step 4 on 2 ranks: each round rank 0 drew positions 0 and 2, rank 1 1 and 3
    ranks = [[experience([1, 1, 1, 1, 1, 0, 0, 1], [20, 22]),    # 20 flat, 22 kept
              experience([5, 5, 5, 5, 4, 4, 0, 4], [24, 26])],   # 24 flat, 26 kept
             [experience([0, 1, 3, 3, 0, 0, 0, 0], [21, 23]),    # 21 kept, 23 flat
              experience([1, 0, 0, 1, 1, 0, 0, 0], [25, 27])]]   # 25 kept, 27 kept
    # kept in draw order: 21 22 25 26 27 -> trained 21 22 25 26; rank 0: 21 25, rank 1: 22 26
    for rank, want in ((0, [21, 25]), (1, [22, 26])):
        env = SimpleNamespace(**{**vars(CPU), "dp_size": 2, "dp_rank": rank})
        shaping = shaper("rollout.prompts_per_step=4", "rollout.n=4",
                         "features.dapo.dynamic_sampling=true", env=env)
        shaping._gather = lambda parts: ranks
        got, padding, metrics = shaping._select(ranks[rank], batch=4)
        assert got.prompt_indices == want and padding == [False] * 8
        assert got.texts == [f"p{p}" for p in want for _ in range(4)]
        assert got.rollout_s == 2.0, "this rank's own generation seconds"
        assert metrics["dynamic_sampling/kept_groups"] == 5.0
        assert metrics["dynamic_sampling/dropped_groups"] == 3.0
        assert metrics["dynamic_sampling/generated_groups"] == 8.0


def test_overlong_penalty_lowers_rewards_before_the_groups_are_judged() -> None:
    # max 4 tokens, buffer 2: 3 tokens cost 0.5, 4 cost 1
    part = experience([1, 1, 0, 0], [10, 11])
    part.samples = [sample(3, eos=True), sample(1, eos=True), sample(4), sample(4)]
    got, metrics = shaper("features.dapo.overlong=penalty", "features.dapo.overlong_buffer=2",
                          "features.dapo.dynamic_sampling=true",
                          "rollout.prompts_per_step=1").shape(rounds_of(part), refill=True)
    # group 10 is no longer flat (0.5, 1), group 11 is (-1, -1)
    assert got.prompt_indices == [10] and got.rewards.tolist() == [0.5, 1.0]
    assert metrics["overlong/penalized"] == 1.0 and metrics["overlong/penalty_mean"] == -0.25


def test_overlong_filter_masks_truncated_responses_and_keeps_their_rewards() -> None:
    part = experience([1, 0, 0, 1], [10, 11])
    part.samples = [sample(4), sample(4, eos=True), sample(2),
                    sample(4, mask=[1.0, 1.0, 1.0, 1.0])]
    got, metrics = shaper("features.dapo.overlong=filter").shape(rounds_of(part), refill=True)
    assert got.rewards.tolist() == [1, 0, 0, 1]
    masks = [None if s.loss_mask is None else s.loss_mask.tolist() for s in got.samples]
    assert masks == [[0.0] * 4, None, None, [0.0] * 4]
    assert metrics == {"overlong/filtered": 2.0, "response_truncated_fraction": 0.5}
    # the penalty alone reports the truncated share too, and masks nothing
    got, metrics = shaper("features.dapo.overlong=penalty", "features.dapo.overlong_buffer=1"
                          ).shape(rounds_of(part), refill=True)
    assert metrics["response_truncated_fraction"] == 0.5
    assert metrics["overlong/penalized"] == 3.0 and metrics["overlong/penalty_mean"] == -0.75
    assert [s.loss_mask is None for s in got.samples] == [True, True, True, False]


def test_nothing_changes_when_shaping_is_off() -> None:
    part = experience([1, 1, 0, 0], [10, 11])
    got, metrics = shaper().shape(rounds_of(part), refill=True)
    assert got is part and metrics == {}
