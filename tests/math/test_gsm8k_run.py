"""End to end on CPU, nothing downloaded: a local Qwen3-style checkpoint (BPE tokenizer trained
here, Qwen's chat template, tiny random Qwen3) and a GSM8K-style parquet in verl's layout.
``graft train`` runs on them with the math reward; the prompts the rollout gets are the chat
template's ids, and a response with the right boxed answer scores 1."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import graft
from graft import hookimpl
from graft.rollout.types import RolloutSample
from graft.testing.chat import gsm8k_rows, messages_of, write_chat_checkpoint, write_verl_parquet

ROWS = gsm8k_rows(8)
SMALL = ("rollout.prompts_per_step=4", "rollout.n=2", "rollout.max_new_tokens=8",
         "features.reward_pool.workers=2", "checkpoint.every_steps=0",
         "checkpoint.save_at_end=false", "export.hf_at_end=false")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_chat_checkpoint(tmp_path_factory.mktemp("gsm8k") / "qwen3-chat")


@pytest.fixture
def parquet(tmp_path: Path) -> Path:
    return write_verl_parquet(tmp_path / "train.parquet", ROWS)


@pytest.mark.slow  # a CLI process: torch, transformers and a reward worker start (~20 s idle)
def test_graft_train_runs_on_a_local_checkpoint_and_a_verl_parquet(graft_train, checkpoint,
                                                                   parquet, tmp_path) -> None:
    run_dir = tmp_path / "run"
    graft_train(run_dir, f"model.path={checkpoint}", "data.source=file", f"data.path={parquet}",
                "data.answer_key=reward_model.ground_truth", "algorithm.reward=math",
                "trainer.total_steps=2", *SMALL, "features.reward_pool.workers=1")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(0.0 <= r["reward_mean"] <= 1.0 and r["reward_timeouts"] == 0.0 for r in rows)


class AnswersHalfRight:
    """A rollout engine that answers the first sample of each prompt with the right boxed
    answer and the second with a wrong one, and keeps the prompt ids it was given."""

    kind = "half-right"
    model = None
    llm = None

    def __init__(self, *, tokenizer) -> None:
        self.tokenizer, self.prompts = tokenizer, []

    def request_extras(self, *names: str) -> None:
        from graft.rollout import refuse_extras

        refuse_extras(self.kind, names)

    def generate(self, prompts, spec):
        out = []
        for index, ids in enumerate(prompts):
            self.prompts.append(list(ids))
            question = re.search(r"user\n(.*) Put the final", self.tokenizer.decode(ids)).group(1)
            answer = int(next(r.answer for r in ROWS if r.question == question))
            text = f"So the answer is \\boxed{{{answer if index % 2 == 0 else answer + 1}}}."
            response = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            out.append(RolloutSample(list(ids), [*response, self.tokenizer.eos_token_id], None))
        return out

    def sync_weights(self):
        return {}

    def close(self) -> None:
        pass


def test_prompts_are_templated_and_math_verify_scores_the_answers(graft_plugin, checkpoint,
                                                                  parquet, tmp_path) -> None:
    engines = []

    class HalfRight:
        @hookimpl
        def graft_rollout_engines(self):
            return {"half-right": lambda *, tokenizer: engines.append(
                AnswersHalfRight(tokenizer=tokenizer)) or engines[-1]}

    graft_plugin(HalfRight(), name="half-right")
    metrics = graft.train(overrides=[
        f"trainer.run_dir={tmp_path / 'run'}", "engine.device=cpu", f"model.path={checkpoint}",
        "data.source=file", f"data.path={parquet}", "algorithm.reward=math",
        "rollout.engine=half-right", "trainer.total_steps=2", *SMALL])
    assert [m["reward_mean"] for m in metrics] == [0.5, 0.5]  # right: 1, wrong: 0
    (engine,) = engines
    tokenizer = engine.tokenizer
    expected = {tuple(tokenizer.apply_chat_template(messages_of(r), add_generation_prompt=True)
                      ["input_ids"]) for r in ROWS}
    assert len(engine.prompts) == 2 * 4 * 2 and set(map(tuple, engine.prompts)) <= expected
