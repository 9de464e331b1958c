"""``samples.jsonl`` of a multi-turn run shows what the model saw: the prompt the
environment's ``reset`` returned (not the dataset's), and the episode's turns, model and
environment, in training and in validation (a tiny Llama on CPU, an environment registered as
a plugin)."""

from __future__ import annotations

import json
from pathlib import Path

from graft import hookimpl
from graft.config import compose
from graft.training.trainer import Trainer

RUN = ("engine.device=cpu", "model.preset=tiny-llama", "rollout.prompts_per_step=2",
       "rollout.n=2", "rollout.max_new_tokens=4", "checkpoint.every_steps=0",
       "checkpoint.save_at_end=false", "export.hf_at_end=false", "trainer.log_samples=2")
TOOL_TEXT = " => 7;"


class Rephrases:
    """Prompts the model with its own text of the task; answers the first turn with a tool's
    text, ends the episode after the second. Keeps every episode's actions (ids)."""

    episodes: list[list[list[int]]] = []

    def __init__(self) -> None:
        self.actions: list[list[int]] = []
        Rephrases.episodes.append(self.actions)

    def reset(self, sample):
        return "do " + sample.prompt

    def step(self, action_ids, action_text):
        self.actions.append(list(action_ids))
        if len(self.actions) == 1:
            return TOOL_TEXT, None, False
        return None, 0.5, True


class KeepsThePrompt(Rephrases):
    def reset(self, sample):
        return None


class Plugin:
    @hookimpl
    def graft_environments(self):
        return {"rephrases": Rephrases, "keeps-the-prompt": KeepsThePrompt}


def run(tmp_path: Path, *overrides: str) -> tuple[Trainer, list[dict]]:
    trainer = Trainer(compose([f"trainer.run_dir={tmp_path}", "trainer.total_steps=2", *RUN,
                               *overrides]))
    trainer.fit()
    lines = (tmp_path / "samples.jsonl").read_text().splitlines()
    return trainer, [json.loads(line) for line in lines]


def rendered(tokenizer, text: str) -> str:
    return tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"],
                            skip_special_tokens=False)


def test_the_prompt_is_what_reset_returned_and_the_turns_are_the_episodes(
        graft_plugin, tmp_path: Path) -> None:
    graft_plugin(Plugin(), name="rephrases")
    held_out = tmp_path / "val.jsonl"
    held_out.write_text("".join(f'{{"prompt": "say {w}:", "answer": "abab"}}\n' for w in "ab"))
    Rephrases.episodes = []
    trainer, records = run(tmp_path / "run", "features.multiturn.environment=rephrases",
                           f"data.val_path={held_out}", "trainer.val_every_steps=1")
    tokenizer = trainer.tokenizer
    assert [(r["step"], r["split"]) for r in records] == [
        (0, "val"), (0, "val"), (1, "train"), (1, "train"), (1, "val"), (1, "val"),
        (2, "train"), (2, "train"), (2, "val"), (2, "val")]
    asked = {rendered(tokenizer, "do " + sample.prompt) for sample in trainer.job.texts}
    asked |= {rendered(tokenizer, f"do say {w}:") for w in "ab"}  # the held-out prompts
    tool = rendered(tokenizer, TOOL_TEXT)
    actions = {tokenizer.decode(ids, skip_special_tokens=False)
               for episode in Rephrases.episodes for ids in episode}
    for record in records:
        assert record["prompt"] in asked and record["prompt"].startswith("do ")
        model, environment, last = record["turns"]
        assert [t["source"] for t in record["turns"]] == ["model", "environment", "model"]
        assert environment["text"] == tool and {model["text"], last["text"]} <= actions
        assert tool in record["response"]  # the response: as the reward saw it


def test_reset_returning_none_logs_the_loaders_prompt(graft_plugin, tmp_path: Path) -> None:
    graft_plugin(Plugin(), name="rephrases")
    trainer, records = run(tmp_path, "features.multiturn.environment=keeps-the-prompt")
    loader_prompts = {trainer.tokenizer.decode(ids, skip_special_tokens=False)
                      for ids in trainer.job.prompts}
    assert len(records) == 4 and all(r["prompt"] in loader_prompts for r in records)
    assert all([t["source"] for t in r["turns"]] == ["model", "environment", "model"]
               for r in records)


def test_a_run_without_an_environment_has_no_turns(tmp_path: Path) -> None:
    trainer, records = run(tmp_path)
    loader_prompts = {trainer.tokenizer.decode(ids, skip_special_tokens=False)
                      for ids in trainer.job.prompts}
    assert len(records) == 4 and all(r["prompt"] in loader_prompts for r in records)
    assert not any("turns" in r for r in records)
