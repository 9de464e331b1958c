"""``trainer.log_sample_responses``: ``samples.jsonl`` holds a logged prompt's first response
(the default, as before) or every response of its group, in training and validation (a tiny
Llama on CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graft.config import compose
from graft.errors import ConfigError
from graft.training.trainer import Trainer

RUN = ("engine.device=cpu", "model.preset=tiny-llama", "rollout.prompts_per_step=2",
       "rollout.n=3", "rollout.max_new_tokens=4", "checkpoint.every_steps=0",
       "checkpoint.save_at_end=false", "export.hf_at_end=false", "trainer.total_steps=1",
       "trainer.log_samples=2", "trainer.val_every_steps=1", "val.n=2",
       "val.temperature=1.0", "data.val_answer_key=answer")


def run(tmp_path: Path, *overrides: str) -> list[dict]:
    held_out = tmp_path / "val.jsonl"
    held_out.write_text("".join(json.dumps({"prompt": f"say {w}:", "answer": "abab"}) + "\n"
                                for w in ("a", "b", "ab")))
    run_dir = tmp_path / "run"
    Trainer(compose([f"trainer.run_dir={run_dir}", f"data.val_path={held_out}", *RUN,
                     *overrides])).fit()
    return [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]


def test_by_default_a_prompt_has_one_line_with_its_first_response(tmp_path: Path) -> None:
    records = run(tmp_path)
    assert [(r["step"], r["split"]) for r in records] == [
        (0, "val"), (0, "val"), (1, "train"), (1, "train"), (1, "val"), (1, "val")]
    for record in records:
        assert "response_index" not in record
        assert record["reward"] == record["group_rewards"][0]
        assert len(record["group_rewards"]) == (3 if record["split"] == "train" else 2)


def test_all_writes_every_response_of_a_logged_prompt(tmp_path: Path) -> None:
    records = run(tmp_path, "trainer.log_sample_responses=all")
    assert [(r["step"], r["split"], r["response_index"]) for r in records] == [
        (0, "val", 0), (0, "val", 1), (0, "val", 0), (0, "val", 1),
        *[(1, "train", i) for _ in range(2) for i in range(3)],
        (1, "val", 0), (1, "val", 1), (1, "val", 0), (1, "val", 1)]
    for group in (records[i:i + 2] for i in (0, 2)):  # step 0: two held-out prompts
        assert len({r["prompt"] for r in group}) == 1
        assert [r["reward"] for r in group] == group[0]["group_rewards"]
    train = [r for r in records if r["split"] == "train"]
    for group in (train[:3], train[3:]):
        assert len({r["prompt"] for r in group}) == 1
        assert [r["reward"] for r in group] == group[0]["group_rewards"]
        assert all(isinstance(r["response"], str) for r in group)


def test_another_value_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="log_sample_responses"):
        compose(["trainer.log_sample_responses=every"])
