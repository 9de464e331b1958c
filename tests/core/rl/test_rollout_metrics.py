"""The lengths an RL step reports, as TRL and verl report them: response length mean, max and
min, the share of responses cut at ``rollout.max_new_tokens``, and the prompt length."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

# 4 prompts x 4 answers of up to 48 tokens from the tiny random model and the built-in
# character tokenizer (one token per character, <bos>/<eos>/<pad>/<unk> one each): some
# answers reach <eos> before 48 tokens, others are cut there. Every prompt is logged.
ARGS = ("trainer.total_steps=2", "rollout.prompts_per_step=4", "rollout.n=4",
        "rollout.max_new_tokens=48", "trainer.log_samples=4", "export.hf_at_end=false")
SPECIAL = re.compile(r"<(pad|bos|eos|unk)>")


@pytest.mark.slow
def test_length_metrics(graft_train, metrics_of, tmp_path: Path) -> None:
    graft_train(tmp_path, *ARGS)
    rows = metrics_of(tmp_path)
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").open()]
    for row in rows:
        assert 0 <= row["response_length_min"] <= row["response_length"] \
            <= row["response_length_max"] <= 48
        cut = row["response_truncated_fraction"] * 16
        assert cut == round(cut), "a share of the step's 16 responses"
        if cut:
            assert row["response_length_max"] == 48, "a cut response has all 48 tokens"
        prompts = [SPECIAL.sub("x", s["prompt"]) for s in samples if s["step"] == row["step"]]
        assert len(prompts) == 4
        assert row["prompt_length"] == sum(map(len, prompts)) / 4
    assert any(0 < row["response_truncated_fraction"] < 1 for row in rows), rows
