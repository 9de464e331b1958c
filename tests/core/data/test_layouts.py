"""verl's and TRL's dataset layouts read as they are: chat prompts, nested answer keys by dotted
path, data_source and extra_info with the sample; keys that read nothing and malformed records
are errors naming the file, the row (or line), the key and what the record has."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from graft.config import DataConfig
from graft.data.dataset import load_text_samples
from graft.errors import DataError
from graft.testing.chat import gsm8k_rows, messages_of, write_trl_jsonl, write_verl_parquet


def rl_samples(path: Path, **keys: str | None) -> list:
    return load_text_samples(DataConfig(source="file", path=str(path), **keys), seed=0,
                             require_response=False)


def test_verl_parquet_is_read_as_it_is(verl_gsm8k: Path) -> None:
    schema = pq.read_schema(verl_gsm8k)
    assert pa.types.is_struct(schema.field("reward_model").type)  # the layout verl writes
    assert pa.types.is_list(schema.field("prompt").type)
    rows = gsm8k_rows(8)
    for key in ("auto", "reward_model.ground_truth"):
        samples = rl_samples(verl_gsm8k, answer_key=key)
        assert [s.answer for s in samples] == [r.answer for r in rows]
    first = samples[0]
    assert first.prompt == messages_of(rows[0])
    assert first.data_source == "openai/gsm8k"
    assert first.extra_info == {"split": "train", "index": 0, "answer": f"#### {rows[0].answer}",
                                "question": rows[0].question}
    assert first.origin == f"{verl_gsm8k}, row 1"


@pytest.mark.parametrize("chat", [True, False])
def test_trl_jsonl_prompt_and_solution(tmp_path: Path, chat: bool) -> None:
    rows = gsm8k_rows(3)
    path = write_trl_jsonl(tmp_path / "trl.jsonl", rows, chat=chat)
    samples = rl_samples(path)
    assert [s.answer for s in samples] == [r.answer for r in rows]
    assert samples[2].prompt == (messages_of(rows[2]) if chat else rows[2].question)
    assert (samples[2].data_source, samples[2].extra_info) == ("", None)


def test_trl_answer_column_and_nested_parquet_keys(tmp_path: Path) -> None:
    path = tmp_path / "trl.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": "1+1=", "answer": 2,
                                          "meta": {"gold": {"value": "two"}}}]), path)
    (sample,) = rl_samples(path)
    assert sample.answer == "2"  # auto finds `answer`; a number becomes its text
    (sample,) = rl_samples(path, answer_key="meta.gold.value")
    assert sample.answer == "two"


def test_a_dotted_key_that_reads_nothing_names_file_row_and_keys(verl_gsm8k: Path) -> None:
    with pytest.raises(DataError, match=rf"^{verl_gsm8k}, row 1: record 1 has no "
                                        r"'reward_model.answer' field \(it has 'reward_model' "
                                        r"with: style, ground_truth\); set data.answer_key"):
        rl_samples(verl_gsm8k, answer_key="reward_model.answer")
    with pytest.raises(DataError, match=r"row 1: record 1 has no 'solution' field \(it has: "
                                        r"data_source, prompt, ability, reward_model, "
                                        r"extra_info\)"):
        rl_samples(verl_gsm8k, answer_key="solution")


def test_a_missing_prompt_key_is_named(verl_gsm8k: Path) -> None:
    with pytest.raises(DataError, match=r"row 1: record 1 has no 'question' field.*"
                                        r"set data.prompt_key"):
        rl_samples(verl_gsm8k, prompt_key="question")


def test_no_answer_under_auto_is_an_error_for_rl_unless_null(tmp_path: Path) -> None:
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps({"prompt": "hi", "label": "x"}) + "\n")
    with pytest.raises(DataError, match=r"line 1: record 1 has none of the answer keys "
                                        r"data.answer_key=auto looks for \(reward_model."
                                        r"ground_truth, solution, answer, response; it has: "
                                        r"prompt, label\)"):
        rl_samples(path)
    (sample,) = rl_samples(path, answer_key=None)
    assert sample.answer is None
    (sft,) = load_text_samples(DataConfig(source="file", path=str(path), response_key="label"),
                               seed=0, require_response=True)
    assert (sft.response, sft.answer) == ("x", None)


@pytest.mark.parametrize(("prompt", "message"), [
    ([{"role": "user"}], r"'prompt' is a list, but its item 1 is not a chat message"),
    ([{"role": "user", "content": "a"}, "b"], r"'prompt' is a list, but its item 2 .*: 'b'"),
    (42, r"'prompt' must be text or a list of chat messages.*got 42"),
    ([], r"'prompt' must be text or a list of chat messages"),
])
def test_a_malformed_jsonl_prompt_names_file_and_line(tmp_path: Path, prompt, message) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"prompt": "ok", "answer": "1"}) + "\n\n"
                    + json.dumps({"prompt": prompt, "answer": "1"}) + "\n")
    with pytest.raises(DataError, match=rf"^{path}, line 3: {message}"):
        rl_samples(path)


def test_a_malformed_verl_row_names_file_and_row(tmp_path: Path) -> None:
    rows = gsm8k_rows(3)
    path = write_verl_parquet(tmp_path / "v.parquet", rows)
    table = pq.read_table(path).to_pylist()
    table[2]["prompt"] = [{"role": "user", "content": None}]  # a null content in row 3
    pq.write_table(pa.Table.from_pylist(table), path)
    with pytest.raises(DataError, match=rf"^{path}, row 3: 'prompt' is a list, but its item 1 "
                                        r"is not a chat message"):
        rl_samples(path)


@pytest.mark.parametrize(("response", "message"), [
    (["b"], r"'response' is a list, but its item 1 is not a chat message"),
    (5, r"'response' must be text or a list of chat messages"),
])
def test_a_non_text_response_names_the_record(tmp_path: Path, response, message) -> None:
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps({"prompt": "a", "response": response}) + "\n")
    with pytest.raises(DataError, match=rf"^{path}, line 1: {message}"):
        load_text_samples(DataConfig(source="file", path=str(path)), seed=0,
                          require_response=True)


def test_an_empty_parquet_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"prompt": pa.array([], pa.string())}), path)
    with pytest.raises(DataError, match=rf"dataset file {path} holds no records"):
        rl_samples(path)
