"""Advantages, KL penalties and rewards: the formulas on small hand-checked cases."""

from __future__ import annotations

import math

import pytest
import torch

from graft import hookimpl
from graft.config import compose
from graft.data.tasks import TextSample, positional_match_reward
from graft.rl.advantages import group_advantages
from graft.rl.kl import kl_penalty
from graft.rl.rewards import resolve_reward, reward_names


def test_grpo_normalises_each_group() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])
    adv = group_advantages(rewards, 4, estimator="grpo")
    assert torch.allclose(adv[:4], torch.tensor([0.5, -0.5, -0.5, 0.5]) / math.sqrt(1 / 3),
                          atol=1e-4)
    assert torch.equal(adv[4:], torch.zeros(4)), "a group with equal rewards learns nothing"


def test_dr_grpo_skips_the_std() -> None:
    adv = group_advantages(torch.tensor([3.0, 1.0]), 2, estimator="grpo", norm_by_std=False)
    assert adv.tolist() == [1.0, -1.0]


def test_rloo_compares_with_the_others_mean() -> None:
    adv = group_advantages(torch.tensor([3.0, 0.0, 0.0]), 3, estimator="rloo")
    assert torch.allclose(adv, torch.tensor([3.0, -1.5, -1.5]))


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
