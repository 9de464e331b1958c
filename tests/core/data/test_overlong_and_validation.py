"""Prompts over data.max_prompt_tokens (an error, or skipped and counted), and the held-out set
of data.val_path with its own keys."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from graft.config import DataConfig
from graft.data.dataset import load_prompts, load_validation_prompts, tokenize_sft
from graft.data.tasks import TextSample
from graft.data.tokenizer import builtin_tokenizer
from graft.errors import DataError
from graft.testing.chat import gsm8k_rows, messages_of, write_trl_jsonl


def write(path: Path, prompts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"prompt": p, "answer": str(i)}) + "\n"
                            for i, p in enumerate(prompts)))
    return path


def data(path: Path, **fields: Any) -> DataConfig:
    return DataConfig(source="file", path=str(path), max_prompt_tokens=8, **fields)


def test_overlong_prompts_are_errors_by_default(tmp_path: Path) -> None:
    path = write(tmp_path / "d.jsonl", ["a", "x" * 20])
    with pytest.raises(DataError, match=rf"^{path}, line 2: the prompt has 21 tokens, more "
                                        r"than data.max_prompt_tokens=8; raise it, shorten the "
                                        r"prompt, or set data.overlong_prompts=skip"):
        load_prompts(data(path), builtin_tokenizer(), seed=0)


def test_skip_drops_counts_and_logs_overlong_prompts(tmp_path: Path, caplog) -> None:
    path = write(tmp_path / "d.jsonl", ["a", "x" * 20, "b", "y" * 30])
    with caplog.at_level(logging.WARNING, logger="graft.data"):
        prompts = load_prompts(data(path, overlong_prompts="skip"), builtin_tokenizer(), seed=0)
    assert [s.prompt for s in prompts.samples] == ["a", "b"]
    assert [s.answer for s in prompts.samples] == ["0", "2"] and prompts.skipped == 2
    assert len(prompts.ids) == 2
    assert (f"skipped 2 of 4 prompts longer than data.max_prompt_tokens=8 "
            f"(data.overlong_prompts=skip; the first: {path}, line 2, 21 tokens)") in caplog.text


def test_skip_that_leaves_nothing_fails(tmp_path: Path) -> None:
    path = write(tmp_path / "d.jsonl", ["x" * 20, "y" * 30])
    with pytest.raises(DataError, match=r"every one of the 2 prompts is longer than "
                                        r"data.max_prompt_tokens=8 .*leaves none"):
        load_prompts(data(path, overlong_prompts="skip"), builtin_tokenizer(), seed=0)


def test_sft_skips_the_whole_sample(tmp_path: Path) -> None:
    samples = [TextSample("a", "b", None), TextSample("x" * 20, "c", None)]
    kept = tokenize_sft(samples, builtin_tokenizer(), max_prompt_tokens=8, max_response_tokens=8,
                        overlong_prompts="skip")
    assert len(kept) == 1 and builtin_tokenizer().decode(kept[0].input_ids[1:-1]) == "ab"


def test_the_held_out_set_is_loaded_like_the_training_set(tmp_path: Path,
                                                          chat_tokenizer: Any) -> None:
    train = write_trl_jsonl(tmp_path / "train.jsonl", gsm8k_rows(2))
    rows = gsm8k_rows(3, seed=9)
    held_out = tmp_path / "val.jsonl"
    held_out.write_text("".join(json.dumps({"messages": messages_of(r), "gold": r.answer}) + "\n"
                                for r in rows))
    cfg = DataConfig(source="file", path=str(train), val_path=str(held_out),
                     val_prompt_key="messages", val_answer_key="gold")
    val = load_validation_prompts(cfg, chat_tokenizer)
    assert [s.answer for s in val.samples] == [r.answer for r in rows]
    assert val.ids[0] == list(chat_tokenizer.apply_chat_template(
        messages_of(rows[0]), add_generation_prompt=True)["input_ids"])
    assert val.samples[0].origin == f"{held_out}, line 1"
    assert load_validation_prompts(DataConfig(source="file", path=str(train)),
                                   chat_tokenizer) is None


def test_the_held_out_set_defaults_to_the_training_keys(tmp_path: Path) -> None:
    train = write(tmp_path / "train.jsonl", ["a"])
    held_out = tmp_path / "val.jsonl"
    held_out.write_text(json.dumps({"question": "b", "answer": "1"}) + "\n")
    cfg = data(train, val_path=str(held_out))
    with pytest.raises(DataError, match=rf"^{held_out}, line 1: record 1 has no 'prompt' field "
                                        r"\(it has: question, answer\); set data.val_prompt_key"):
        load_validation_prompts(cfg, builtin_tokenizer())
    missing = data(train, val_path=str(tmp_path / "nope.jsonl"))
    with pytest.raises(DataError, match=r"does not exist \(data.val_path\)"):
        load_validation_prompts(missing, builtin_tokenizer())
