"""Tokenizer, synthetic tasks, dataset files and the sampler."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graft.config import DataConfig
from graft.data.dataset import load_text_samples, tokenize_sft
from graft.data.sampler import EpochSampler
from graft.data.tasks import TASKS, generate_samples
from graft.data.tokenizer import builtin_tokenizer
from graft.errors import DataError


def test_builtin_tokenizer_round_trips_text() -> None:
    tokenizer = builtin_tokenizer()
    ids = tokenizer("copy ab:\n12+3=", add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == "copy ab:\n12+3="
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1, 2)
    assert len(tokenizer) == 100


@pytest.mark.parametrize("task", sorted(TASKS))
def test_tasks_are_seeded_and_rewarded(task: str) -> None:
    samples = generate_samples(task, 20, seed=4)
    assert samples == generate_samples(task, 20, seed=4)
    assert all(TASKS[task].reward(s.response, s) == 1.0 for s in samples)


def test_sft_tokenization_marks_the_response() -> None:
    (sample,) = tokenize_sft(generate_samples("add", 1, seed=0), builtin_tokenizer(),
                             max_prompt_tokens=32, max_response_tokens=8)
    assert sample.input_ids[0] == 1 and sample.input_ids[-1] == 2
    assert builtin_tokenizer().decode(sample.input_ids[sample.response_start:-1]).isdigit()


def test_too_long_prompt_is_named() -> None:
    with pytest.raises(DataError, match="sample 0: the prompt has .* data.max_prompt_tokens=3"):
        tokenize_sft(generate_samples("copy", 1, seed=0), builtin_tokenizer(),
                     max_prompt_tokens=3, max_response_tokens=8)


def test_jsonl_missing_column_names_the_record(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"prompt": "a", "response": "b"}) + "\n" +
                    json.dumps({"question": "c"}) + "\n")
    with pytest.raises(DataError, match="record 2 has no 'prompt' field.*question"):
        load_text_samples(DataConfig(source="file", path=str(path)), seed=0,
                          require_response=True)


def test_sampler_resumes_where_it_stopped() -> None:
    straight = EpochSampler(10, seed=1)
    batches = [straight.next_batch(4) for _ in range(5)]
    resumed = EpochSampler(10, seed=1)
    for _ in range(2):
        resumed.next_batch(4)
    state = resumed.state_dict()
    fresh = EpochSampler(10, seed=1)
    fresh.load_state_dict(state)
    assert [fresh.next_batch(4) for _ in range(3)] == batches[2:]
    assert sorted(batches[0] + batches[1] + batches[2][:2]) == list(range(10))
