"""``graft_batch_shaper``: a plugin's `BatchShaper` decides what each RL step trains on (it
may draw more rounds; its experience is the update's, its metrics the step's); without one a
step draws once and trains on it as it is (a tiny Llama on CPU, 1 rank; an in-test shaper, no
graft-dapo). Also the helpers such a plugin shares with the core: `merge_experiences`,
`is_truncated`; and the old ``algorithm.*`` keys of graft-dapo refused without it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from graft import hookimpl
from graft.config import compose
from graft.errors import ConfigError
from graft.plugins import GraftPluginManager
from graft.rl import BatchShaper, Experience, is_truncated, merge_experiences
from graft.rollout import RolloutSample
from graft.training.trainer import Trainer

N, PROMPTS, EOS = 2, 2, 2
RUN = ("engine.device=cpu", "model.preset=tiny-llama", f"rollout.prompts_per_step={PROMPTS}",
       f"rollout.n={N}", "rollout.max_new_tokens=4", "checkpoint.every_steps=0",
       "checkpoint.save_at_end=false", "export.hf_at_end=false", "trainer.val_every_steps=0")


class TwoRounds:
    """Draws two rounds and trains on the second, its rewards replaced by 1, 0, 1, 0..."""

    def __init__(self) -> None:
        self.calls: list[bool] = []  # refill, per step
        self.drawn: list[Experience] = []
        self.shaped: list[Experience] = []

    def shape(self, draw, *, refill: bool) -> tuple[Experience, dict[str, float]]:
        self.calls.append(refill)
        first, second = draw(), draw()
        self.drawn += [first, second]
        rewards = torch.tensor([1.0 - k % 2 for k in range(len(second.samples))],
                               dtype=torch.float64)
        shaped = dataclasses.replace(second, rewards=rewards)
        self.shaped.append(shaped)
        return shaped, {"shaper/rounds": 2.0, "response_truncated_fraction": 0.75}


class Recorder:
    """Counts the rollouts (one per draw) and records every update's token ids; with
    ``shaper``, supplies it through ``graft_batch_shaper``."""

    def __init__(self, shaper: TwoRounds | None = None) -> None:
        self.shaper = shaper
        self.hook_calls: list[dict] = []
        self.rollouts = 0
        self.updated: list[list[int]] = []

    @hookimpl
    def graft_batch_shaper(self, cfg, env, eos_token_id):
        self.hook_calls.append({"cfg": cfg, "env": env, "eos_token_id": eos_token_id})
        return self.shaper

    @hookimpl
    def graft_rollout_begin(self):
        self.rollouts += 1

    @hookimpl
    def graft_prepare_inputs(self, batch, layout, phase):
        if phase == "update":
            self.updated += [ids.tolist() for ids in layout.unpad(batch["input_ids"])]


def test_hook_graft_batch_shaper_decides_what_the_step_trains_on(graft_plugin,
                                                                 tmp_path: Path) -> None:
    plugin = Recorder(TwoRounds())
    graft_plugin(plugin, name="two-rounds")
    trainer = Trainer(compose([f"trainer.run_dir={tmp_path}", "trainer.total_steps=2", *RUN]))
    job, shaper = trainer.job, plugin.shaper
    assert isinstance(shaper, BatchShaper) and job.shaper is shaper
    (call,) = plugin.hook_calls  # once per run, with the run's config, env and eos
    assert call["cfg"] is job.cfg and call["env"] is trainer.env
    assert call["eos_token_id"] == trainer.tokenizer.eos_token_id
    rows = trainer.fit()

    assert shaper.calls == [True, True]  # colocated: the shaper may draw again
    assert plugin.rollouts == 4  # two draws a step, each one rollout
    # the update trained on the shaped experience only: the second round of each step
    trained = [list(s.prompt_ids) + list(s.response_ids) for e in shaper.shaped for s in e.samples]
    assert sorted(plugin.updated) == sorted(trained)
    assert len(trained) == 2 * PROMPTS * N
    # its rewards are the step's; its metrics join the step's, replacing the core's own
    assert all(row["reward_mean"] == 0.5 for row in rows)
    assert [row["shaper/rounds"] for row in rows] == [2.0, 2.0]
    assert [row["response_truncated_fraction"] for row in rows] == [0.75, 0.75]


def test_hook_graft_batch_shaper_absent_the_step_draws_once(graft_plugin, tmp_path: Path) -> None:
    plugin = Recorder(None)  # answers None: no plugin shapes (graft-dapo's default does too)
    graft_plugin(plugin, name="no-shaper")
    trainer = Trainer(compose([f"trainer.run_dir={tmp_path}", "trainer.total_steps=2", *RUN]))
    assert trainer.job.shaper is None and len(plugin.hook_calls) == 1
    rows = trainer.fit()
    assert plugin.rollouts == 2  # one draw a step
    assert len(plugin.updated) == 2 * PROMPTS * N
    assert all("shaper/rounds" not in row for row in rows)
    assert all(0.0 <= row["response_truncated_fraction"] <= 1.0 for row in rows)


def sample(length: int, *, eos: bool = False) -> RolloutSample:
    """A response of ``length`` tokens (token 7), ending with ``eos`` when asked."""
    return RolloutSample([1, 5], [7] * (length - 1) + [EOS if eos else 7], None)


def test_truncation_is_a_full_last_model_turn_without_eos() -> None:
    assert is_truncated(sample(4), max_new_tokens=4, eos_token_id=EOS)
    assert not is_truncated(sample(4, eos=True), max_new_tokens=4, eos_token_id=EOS)
    assert not is_truncated(sample(3), max_new_tokens=4, eos_token_id=EOS)
    # an episode: model tokens 1, environment tokens 0; the cap applies to the last model turn
    episode = RolloutSample([1], [7, 7, 9, 9, 7, 7, 7, 7], None,
                            loss_mask=torch.tensor([1.0, 1, 0, 0, 1, 1, 1, 1]))
    assert is_truncated(episode, max_new_tokens=4, eos_token_id=EOS)
    episode.loss_mask = torch.tensor([1.0, 1, 1, 1, 0, 0, 1, 1])
    assert not is_truncated(episode, max_new_tokens=4, eos_token_id=EOS)
    episode.loss_mask = torch.zeros(8)  # a masked response hides its truncation
    assert not is_truncated(episode, max_new_tokens=4, eos_token_id=EOS)


def experience(rewards: list[float], prompts: list[int],
               versions: list[int] | None = None) -> Experience:
    n = len(rewards) // len(prompts)
    return Experience(list(prompts), [f"p{p}" for p in prompts for _ in range(n)],
                      [sample(2, eos=True) for _ in rewards],
                      torch.tensor(rewards, dtype=torch.float64), 1.0, {"reward_errors": 1.0},
                      versions)


def test_merge_keeps_prompts_samples_rewards_and_versions_together() -> None:
    one = experience([1, 1, 0, 1], [10, 11], versions=[3, 3, 4, 4])
    two = experience([0, 1, 5, 5], [12, 13], versions=[5, 5, 5, 6])
    two.metrics = {"reward_errors": 3.0, "other": 2.0}
    merged = merge_experiences([one, two])
    assert merged.prompt_indices == [10, 11, 12, 13]
    assert merged.rewards.tolist() == [1, 1, 0, 1, 0, 1, 5, 5]
    assert merged.texts == ["p10", "p10", "p11", "p11", "p12", "p12", "p13", "p13"]
    assert merged.policy_versions == [3, 3, 4, 4, 5, 5, 5, 6]
    assert merged.rollout_s == 2.0 and merged.metrics == {"reward_errors": 2.0, "other": 2.0}
    assert merge_experiences([one, experience([1, 1], [9])]).policy_versions is None


@pytest.mark.parametrize("old, new, value", [
    ("algorithm.dynamic_sampling", "features.dapo.dynamic_sampling", "true"),
    ("algorithm.overlong", "features.dapo.overlong", "filter")])
def test_the_old_dapo_keys_name_their_new_home_without_the_plugin(old: str, new: str,
                                                                  value: str) -> None:
    core_only = GraftPluginManager()
    core_only.load(candidates=[])  # the core's built-in plugins only
    with pytest.raises(ConfigError, match=f"'{old}' .*moved: set '{new}' .*graft-dapo"):
        compose([f"{old}={value}"], manager=core_only)
    assert not hasattr(compose([f"{old}=" + ("false" if value == "true" else "none")],
                               manager=core_only).algorithm, old.split(".")[1])
