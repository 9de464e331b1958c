"""``graft_experience_source``: a plugin's `ExperienceSource` supplies each RL step's scored
rollouts in place of the job's own engine, and receives the new weights after every update (a
tiny Llama on CPU, 1 rank, 2 steps; an in-test source of hand-made samples, no
graft-async-rl)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from graft import hookimpl
from graft.config import compose
from graft.rl import Experience, ExperienceSource
from graft.rollout import RolloutSample
from graft.training.trainer import Trainer

N, PROMPTS = 2, 2
RUN = ("engine.device=cpu", "model.preset=tiny-llama", f"rollout.prompts_per_step={PROMPTS}",
       f"rollout.n={N}", "rollout.max_new_tokens=4", "checkpoint.every_steps=0",
       "checkpoint.save_at_end=false", "export.hf_at_end=false", "trainer.total_steps=2")


class HandMade:
    """Each step's samples: the job's prompts, each answered by ``[40 + number, 50 + step,
    eos]``; the first sample of a prompt scores 1, the others 0."""

    def __init__(self, job, eos: int, *, on_policy: bool) -> None:
        self.job, self.eos, self.on_policy = job, eos, on_policy
        self.asked: list[tuple[int, list[int]]] = []  # (step, prompt indices)
        self.published: list[tuple[object, int]] = []  # (engine, step)
        self.loaded: list[dict] = []
        self.closed = 0

    def response(self, step: int, number: int) -> list[int]:
        return [40 + number, 50 + step, self.eos]

    def experience(self, step: int, prompt_indices: list[int]) -> Experience:
        self.asked.append((step, list(prompt_indices)))
        samples = [RolloutSample(list(self.job.prompts[i]), self.response(step, number), None)
                   for i in prompt_indices for number in range(N)]
        rewards = torch.tensor([1.0 if number == 0 else 0.0 for _ in prompt_indices
                                for number in range(N)], dtype=torch.float64)
        texts = [self.job.texts[i] for i in prompt_indices for _ in range(N)]
        return Experience(list(prompt_indices), texts, samples, rewards, rollout_s=0.25,
                          metrics={"handmade/step": float(step)})

    def publish(self, engine, step: int) -> dict[str, float]:
        self.published.append((engine, step))
        return {"handmade/published": float(len(self.published))}

    def state_dict(self) -> dict:
        return {"asked": len(self.asked)}

    def load_state_dict(self, state: dict) -> None:
        self.loaded.append(state)

    def close(self) -> None:
        self.closed += 1


class Plugin:
    """Builds the source, and records the passes and the token ids of every update's
    micro-batches."""

    def __init__(self, *, on_policy: bool) -> None:
        self.on_policy = on_policy
        self.source: HandMade | None = None
        self.calls: list[dict] = []
        self.phases: set[str] = set()
        self.updated: list[list[int]] = []

    @hookimpl
    def graft_experience_source(self, cfg, job, engine, env, run_dir) -> ExperienceSource:
        self.calls.append({"job": job, "engine": engine, "env": env, "run_dir": run_dir})
        self.source = HandMade(job, job.tokenizer.eos_token_id, on_policy=self.on_policy)
        return self.source

    @hookimpl
    def graft_prepare_inputs(self, batch, layout, phase):
        self.phases.add(phase)
        if phase == "update":
            self.updated += [ids.tolist() for ids in layout.unpad(batch["input_ids"])]


@pytest.mark.parametrize("on_policy", [True, False])
def test_hook_graft_experience_source_supplies_the_steps_and_gets_the_weights(
        graft_plugin, tmp_path: Path, on_policy: bool) -> None:
    plugin = Plugin(on_policy=on_policy)
    graft_plugin(plugin, name="hand-made")
    trainer = Trainer(compose([f"trainer.run_dir={tmp_path}", *RUN]))
    job, source = trainer.job, plugin.source
    assert job.source is source
    assert job.rollout is None  # no engine built: the source generates
    (call,) = plugin.calls  # once per run, with the trainer's engine, env and run directory
    assert (call["job"], call["engine"], call["env"], call["run_dir"]) == (
        job, trainer.engine, trainer.env, tmp_path)
    assert job.state_dict()["source"] == {"asked": 0}  # joins the checkpoint
    rows = trainer.fit()

    # each step asked for the sampler's draw of the step's prompts, then published
    assert [step for step, _ in source.asked] == [1, 2]
    assert all(len(indices) == PROMPTS for _, indices in source.asked)
    assert source.published == [(trainer.engine, 1), (trainer.engine, 2)]
    assert source.closed == 1 and source.loaded == []  # closed at the end; nothing to resume
    # the experience's rewards, lengths, timing and metrics are the step's
    assert [row["handmade/step"] for row in rows] == [1.0, 2.0]
    assert [row["handmade/published"] for row in rows] == [1.0, 2.0]
    assert all(row["reward_mean"] == 0.5 and row["response_length"] == 3.0 for row in rows)
    assert all(row["grad_norm"] > 0.0 for row in rows)  # the advantages moved the weights
    # the update trained on exactly those samples: each a prompt and its hand-made response
    expected = [list(job.prompts[i]) + source.response(step, number)
                for step, indices in source.asked for i in indices for number in range(N)]
    assert sorted(plugin.updated) == sorted(expected)
    # samples without log-probs are scored by the trainer; samples that may come from an older
    # policy (``on_policy`` false) get their old log-probs recomputed before the update
    assert plugin.phases == {"rollout_logprobs", "update", *([] if on_policy else ["old_logprobs"])}
