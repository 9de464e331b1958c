"""Advantages, KL penalties and rewards: the formulas on small hand-checked cases."""

from __future__ import annotations

import math

import pytest
import torch

from graft import hookimpl
from graft.config import compose
from graft.data.tasks import TextSample, positional_match_reward
from graft.errors import ConfigError
from graft.losses.policy import kl_penalty
from graft.rl.advantages import AdvantageEstimator, advantage_estimators, compute_advantages
from graft.rl.rewards import resolve_reward, reward_names


def advantages(rewards: list[float], n: int, name: str, *overrides: str) -> torch.Tensor:
    cfg = compose([f"rollout.n={n}", f"algorithm.advantage={name}", *overrides])
    return compute_advantages(advantage_estimators()[name], torch.tensor(rewards), group_size=n,
                              cfg=cfg)


def test_grpo_normalises_each_group() -> None:
    adv = advantages([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0], 4, "grpo")
    assert torch.allclose(adv[:4], torch.tensor([0.5, -0.5, -0.5, 0.5]) / math.sqrt(1 / 3),
                          atol=1e-4)
    assert torch.equal(adv[4:], torch.zeros(4)), "a group with equal rewards learns nothing"


@pytest.mark.parametrize("name", ["grpo", "rloo"])
@pytest.mark.parametrize("reward", [0.7, 2 / 3, 0.1, 1e-7])
def test_equal_rewards_that_float32_cannot_hold_give_exactly_zero(name: str, reward: float) -> None:
    # verl's own assertion: a group whose rewards are all equal has advantage 0 (0.7 is not
    # exact in float32; dividing its rounding noise by a ~0 std gave ~0.06 before).
    adv = advantages([reward] * 8 + [0.0, 1.0] * 4, 8, name)
    assert torch.equal(adv[:8], torch.zeros(8)), adv[:8]
    assert adv[8:].abs().min() > 0.5


def test_dr_grpo_skips_the_std() -> None:
    adv = advantages([3.0, 1.0], 2, "grpo", "algorithm.norm_adv_by_std=false")
    assert adv.tolist() == [1.0, -1.0]


def test_rloo_compares_with_the_others_mean() -> None:
    adv = advantages([3.0, 0.0, 0.0], 3, "rloo")
    assert torch.allclose(adv, torch.tensor([3.0, -1.5, -1.5]))


@pytest.mark.parametrize("name", ["grpo", "rloo"])
def test_group_estimators_refuse_groups_of_one(name: str) -> None:
    with pytest.raises(ConfigError, match=r"rollout.n=1 .* needs rollout.n >= 2"):
        compose(["rollout.n=1", f"algorithm.advantage={name}"])
    assert compose(["rollout.n=1", "trainer.mode=sft"]).rollout.n == 1  # SFT draws no samples


@pytest.mark.parametrize("c", [1.0, 0.5, -3.0])
def test_dual_clip_constant_must_exceed_one(c: float) -> None:
    with pytest.raises(ConfigError, match=r"'loss.clip_ratio_c' is .*: it must be > 1"):
        compose([f"loss.clip_ratio_c={c}"])
    assert compose(["loss.clip_ratio_c=null"]).loss.clip_ratio_c is None


def test_hook_graft_advantage_estimators_adds_a_selectable_estimator(graft_plugin,
                                                                     tmp_path) -> None:
    class Baseline:
        @hookimpl
        def graft_advantage_estimators(self):
            # a plain function: any group size (min 1), gets only the keywords it names
            return {"minus-half": lambda rewards, *, group_size: rewards - 0.5,
                    "pairs": AdvantageEstimator(lambda rewards: rewards * 0, min_group_size=4)}

    graft_plugin(Baseline(), name="baseline")
    assert {"grpo", "rloo", "minus-half", "pairs"} <= set(advantage_estimators())
    assert advantages([1.0, 0.0], 1, "minus-half").tolist() == [0.5, -0.5]
    with pytest.raises(ConfigError, match="needs rollout.n >= 4"):
        compose(["algorithm.advantage=pairs", "rollout.n=2"])
    with pytest.raises(ConfigError, match=r"'grop'. Did you mean 'grpo'\?"):
        compose(["algorithm.advantage=grop"])


def test_kl_penalties() -> None:
    logp, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -2.0])
    assert torch.allclose(kl_penalty(logp, ref, "kl"), torch.tensor([0.5, 0.0]))
    assert torch.allclose(kl_penalty(logp, ref, "mse"), torch.tensor([0.125, 0.0]))
    low_var = kl_penalty(logp, ref, "low_var_kl")
    assert low_var[1] == 0 and low_var[0] == pytest.approx(math.exp(-0.5) + 0.5 - 1)


def test_positional_match_gives_partial_credit() -> None:
    sample = TextSample("say a:", "abab", "abab")
    assert positional_match_reward("abab", sample) == 1.0
    assert positional_match_reward("abzz", sample) == 0.5
    assert positional_match_reward("", sample) == 0.0


def test_auto_reward_follows_the_data_source() -> None:
    assert resolve_reward("auto", "pattern") is positional_match_reward
    assert resolve_reward("auto", "file")("42", TextSample("q", "", "42")) == 1.0


def test_hook_graft_reward_functions_adds_a_selectable_reward(graft_plugin) -> None:
    class Lengthy:
        @hookimpl
        def graft_reward_functions(self):
            return {"length": lambda response, sample: float(len(response))}

    graft_plugin(Lengthy(), name="lengthy")
    assert {"exact_match", "positional_match", "length"} <= set(reward_names())
    assert compose(["algorithm.reward=length"]).algorithm.reward == "length"
    assert resolve_reward("length", "pattern")("abc", TextSample("", "", "")) == 3.0
