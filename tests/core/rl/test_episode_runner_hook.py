"""``graft_episode_runner``: a plugin's runner makes an RL step's samples (and a validation's)
in place of one ``generate`` per prompt, its rewards and metrics are the step's, and the core's
own path runs without one (a tiny Llama on CPU; an in-test runner, no graft-multiturn)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from graft import hookimpl
from graft.config import compose
from graft.rollout import EpisodeBatch, EpisodeRunner, RolloutSample
from graft.training.trainer import Trainer

RUN = ("engine.device=cpu", "model.preset=tiny-llama", "rollout.prompts_per_step=2",
       "rollout.n=2", "rollout.max_new_tokens=3", "checkpoint.every_steps=0",
       "checkpoint.save_at_end=false", "export.hf_at_end=false", "trainer.total_steps=2")
REWARD = 0.25


@dataclass
class Batch:
    """The engine's samples, each rewarded `REWARD` whatever the configured reward says."""

    samples: list[RolloutSample]
    metrics: dict[str, float]

    def total_rewards(self, score, responses, samples) -> list[float]:
        return [REWARD] * len(responses)


class OneGenerate:
    """A runner that calls the engine once and counts what the core asked of it."""

    def __init__(self) -> None:
        self.runs: list[int] = []  # prompts per run
        self.checked = 0

    def run(self, engine, samples, prompts, spec) -> Batch:
        self.runs.append(len(prompts))
        generated = engine.generate(list(prompts) or [[0]], spec)[:len(prompts)]
        return Batch(generated, {"mine/runs": float(len(self.runs))})

    def check_failures(self, batch: Batch) -> None:
        self.checked += 1


class Plugin:
    def __init__(self) -> None:
        self.runner = OneGenerate()
        self.seen: list[tuple[object, object]] = []

    @hookimpl
    def graft_episode_runner(self, cfg, tokenizer, env):
        self.seen.append((cfg.rollout.n, env.dp_size))
        return self.runner


def test_hook_graft_episode_runner_makes_the_steps_and_validations_samples(
        graft_plugin, tmp_path: Path) -> None:
    plugin = Plugin()
    graft_plugin(plugin, name="one-generate")
    held_out = tmp_path / "val.jsonl"
    held_out.write_text("".join(f'{{"prompt": "say {w}:", "answer": "abab"}}\n' for w in "ab"))
    trainer = Trainer(compose([f"trainer.run_dir={tmp_path / 'run'}", *RUN,
                               f"data.val_path={held_out}", "trainer.val_every_steps=2",
                               "val.n=2"]))
    rows = trainer.fit()
    runner = plugin.runner
    assert isinstance(runner, EpisodeRunner) and isinstance(Batch([], {}), EpisodeBatch)
    assert plugin.seen == [(2, 1)]  # built once per run
    train = [row for row in rows if "reward_mean" in row]
    assert [row["reward_mean"] for row in train] == [REWARD, REWARD]  # the batch's rewards
    assert all("mine/runs" in row for row in train) and runner.checked == 2
    # 2 training steps of 4 samples; validation before step 1 and after step 2: 2 prompts x 2
    assert sorted(runner.runs) == [4, 4, 4, 4]
    assert [row["val/reward_mean"] for row in rows if "val/reward_mean" in row] == [REWARD] * 2


def test_without_a_runner_the_engine_generates_one_response_per_prompt(
        graft_plugin, tmp_path: Path) -> None:
    """No plugin's runner (the hook returns None): the RL job generates with the engine and
    the configured reward scores it."""

    class Passes:
        @hookimpl
        def graft_episode_runner(self):
            return None

    graft_plugin(Passes(), name="passes")
    trainer = Trainer(compose([f"trainer.run_dir={tmp_path}", *RUN]))
    rows = trainer.fit()
    assert trainer.job.episodes is None
    assert all("mine/runs" not in row for row in rows) and len(rows) == 2
