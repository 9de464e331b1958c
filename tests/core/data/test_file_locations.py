"""Errors about file data name the file and the 1-based line (JSONL) or row (Parquet)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graft.config import DataConfig
from graft.data.dataset import encode_prompts, load_text_samples, tokenize_sft
from graft.data.tokenizer import builtin_tokenizer
from graft.errors import DataError

LONG = "x" * 40


def write_jsonl(path: Path, lines: list[dict | None]) -> Path:
    """One JSON object per line; None writes a blank line (skipped by the reader)."""
    path.write_text("".join("\n" if row is None else json.dumps(row) + "\n" for row in lines))
    return path


def samples(path: Path, *, require_response: bool = True) -> list:
    return load_text_samples(DataConfig(source="file", path=str(path)), seed=0,
                             require_response=require_response)


@pytest.fixture
def long_prompt_on_line_4(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "response": "b"}, None,
                                              {"prompt": "c", "response": "d"},
                                              {"prompt": LONG, "response": "e"}])


def test_sft_prompt_length_error_names_file_and_line(long_prompt_on_line_4: Path) -> None:
    with pytest.raises(DataError, match=rf"^{long_prompt_on_line_4}, line 4: the prompt has 41 "
                                        r"tokens, more than data.max_prompt_tokens=8"):
        tokenize_sft(samples(long_prompt_on_line_4), builtin_tokenizer(), max_prompt_tokens=8,
                     max_response_tokens=8)


def test_rl_prompt_length_error_names_file_and_line(long_prompt_on_line_4: Path) -> None:
    texts = samples(long_prompt_on_line_4, require_response=False)
    with pytest.raises(DataError, match=rf"^{long_prompt_on_line_4}, line 4: the prompt has"):
        encode_prompts(texts, builtin_tokenizer(), max_tokens=8)


def test_response_length_error_names_file_and_line(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "r.jsonl", [None, {"prompt": "a", "response": LONG}])
    with pytest.raises(DataError, match=rf"^{path}, line 2: the response has 41 tokens"):
        tokenize_sft(samples(path), builtin_tokenizer(), max_prompt_tokens=8,
                     max_response_tokens=8)


def test_parquet_errors_name_the_row(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"prompt": ["a", LONG], "response": ["b", "c"]}), path)
    with pytest.raises(DataError, match=rf"^{path}, row 2: the prompt has"):
        encode_prompts(samples(path), builtin_tokenizer(), max_tokens=8)


def test_missing_field_names_the_line_after_blank_lines(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "m.jsonl", [{"prompt": "a", "response": "b"}, None, None,
                                              {"question": "c"}])
    with pytest.raises(DataError, match=rf"^{path}, line 4: record 2 has no 'prompt' field"):
        samples(path)


def test_synthetic_samples_keep_their_index(tmp_path: Path) -> None:
    from graft.data.tasks import generate_samples

    with pytest.raises(DataError, match="^sample 0: the prompt has"):
        encode_prompts(generate_samples("copy", 1, seed=0), builtin_tokenizer(), max_tokens=2)


@pytest.mark.slow
def test_the_cli_reports_file_and_line(run_graft, long_prompt_on_line_4: Path,
                                       tmp_path: Path) -> None:
    result = run_graft(["train", f"trainer.run_dir={tmp_path / 'run'}", "trainer.mode=sft",
                        "model.preset=tiny-llama", "data.source=file",
                        f"data.path={long_prompt_on_line_4}", "data.max_prompt_tokens=8"])
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"{long_prompt_on_line_4}, line 4: the prompt has 41 tokens" in result.stderr
