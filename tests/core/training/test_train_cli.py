"""``graft train`` end to end: SFT on the embedded default, 1 process and 2 gloo ranks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml


@pytest.mark.slow
def test_default_sft_run_learns_and_writes_the_run_layout(graft_train, metrics_of,
                                                          tmp_path: Path) -> None:
    result = graft_train(tmp_path / "run", "trainer.mode=sft")
    rows = metrics_of(tmp_path / "run")
    assert [r["step"] for r in rows] == list(range(1, 201))
    for key in ("loss", "grad_norm", "tokens_per_s", "peak_memory_gib", "lr"):
        assert key in rows[0]
    assert rows[-1]["loss"] < 0.7 * rows[0]["loss"]
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["trainer"]["mode"] == "sft" and saved["trainer"]["total_steps"] == 200
    assert "summary" in result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen3-moe"])
def test_two_gloo_ranks_follow_the_one_rank_trajectory(graft_train, metrics_of, tmp_path: Path,
                                                       preset: str) -> None:
    common = (f"model.preset={preset}", "trainer.total_steps=4", "trainer.mode=sft")
    graft_train(tmp_path / "one", *common)
    graft_train(tmp_path / "two", *common, nproc=2)
    one, two = metrics_of(tmp_path / "one"), metrics_of(tmp_path / "two")
    for a, b in zip(one, two, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5, abs=1e-6)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
    assert one[-1]["loss"] < one[0]["loss"]


@pytest.mark.slow
def test_file_dataset_and_pad_to_length(graft_train, metrics_of, tmp_path: Path) -> None:
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"question": f"{i}+{i}=", "answer": str(2 * i)}) + "\n"
                            for i in range(40)))
    graft_train(tmp_path / "run", "data.source=file", f"data.path={data}",
          "trainer.mode=sft", "data.prompt_key=question", "data.response_key=answer",
          "trainer.total_steps=3",
          "engine.pad_to_length=true", "engine.pad_to_length_bucket=64",
          "model.preset=tiny-llama")
    assert len(metrics_of(tmp_path / "run")) == 3


@pytest.mark.slow
def test_parquet_dataset(graft_train, metrics_of, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp_path / "train.parquet"
    pq.write_table(pa.table({"prompt": ["a=", "b="] * 8, "response": ["1", "2"] * 8}), data)
    graft_train(tmp_path / "run", "data.source=file", f"data.path={data}",
          "trainer.mode=sft", "trainer.total_steps=2", "model.preset=tiny-llama")
    assert len(metrics_of(tmp_path / "run")) == 2


@pytest.mark.parametrize(("args", "message"), [
    (["data.source=file", "data.path=/nonexistent/train.jsonl"],
     "dataset file '/nonexistent/train.jsonl' does not exist"),
    (["engine.max_tokens_per_micro_batch=8"], "more than the micro-batch token budget"),
    (["model.path=/tmp"], "is not a Hugging Face model directory"),
    (["model.path=Qwen/Qwen3-0.6B"], "Graft never downloads"),
    (["loss.loss_agg_mode=token-meen"], "Did you mean 'token-mean'"),
    (["model.preset=tiny-lama"], "Did you mean 'tiny-llama'? Valid values:"),
])
def test_bad_input_is_a_clear_error(run_graft, tmp_path: Path, args: list[str],
                                    message: str) -> None:
    result = run_graft(["train", f"trainer.run_dir={tmp_path / 'run'}", "trainer.mode=sft", *args])
    assert result.returncode == 2, result.stderr[-3000:]
    assert message in result.stderr and "Traceback" not in result.stderr


def test_malformed_jsonl_line_is_named(run_graft, tmp_path: Path) -> None:
    data = tmp_path / "bad.jsonl"
    data.write_text('{"prompt": "a", "response": "b"}\n{"prompt": "c", "response": \n')
    result = run_graft(["train", "trainer.mode=sft", "data.source=file", f"data.path={data}",
                        f"trainer.run_dir={tmp_path / 'run'}"])
    assert result.returncode == 2
    assert f"{data}, line 2: not valid JSON" in result.stderr
