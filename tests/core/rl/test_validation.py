"""Validation on the held-out set (``data.val_path``, ``trainer.val_every_steps``, ``val.*``) and
the samples log (``<run_dir>/samples.jsonl``): when it runs, what it measures, what it writes,
that it leaves training's random numbers alone, and its split over data-parallel ranks."""

from __future__ import annotations

import json
import math
from itertools import combinations
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import graft
from graft import hookimpl
from graft.config import compose
from graft.data.dataset import Prompts
from graft.data.tasks import TextSample
from graft.rl.validation import Validator, pass_at_k
from graft.rollout.types import RolloutSample
from graft.testing.chat import gsm8k_rows, messages_of, write_chat_checkpoint, write_verl_parquet
from graft.training.job import validation_due

TRAIN_ROWS, VAL_ROWS = gsm8k_rows(4, seed=1), gsm8k_rows(4, seed=2)
QUIET = ("checkpoint.every_steps=0", "checkpoint.save_at_end=false", "export.hf_at_end=false",
         "engine.device=cpu")


def test_pass_at_k_is_the_unbiased_estimator() -> None:
    for n in range(1, 6):
        for correct in range(n + 1):
            for k in range(1, n + 1):
                draws = list(combinations([1] * correct + [0] * (n - correct), k))
                expected = sum(any(d) for d in draws) / len(draws)  # every k-subset equally likely
                assert math.isclose(pass_at_k(n, correct, k), expected)
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_validation_runs_before_the_first_step_every_n_steps_and_after_the_last() -> None:
    due = [s for s in range(11) if validation_due(s, every=4, total_steps=10)]
    assert due == [0, 4, 8, 10]
    assert not any(validation_due(s, every=0, total_steps=10) for s in range(11))


class Scripted:
    """A rollout engine that answers from the data: at temperature 0 (validation) the even rows
    of a batch with the right answer, the odd ones with a wrong one; it keeps every call."""

    kind = "scripted"
    model = None
    llm = None

    def __init__(self, *, tokenizer) -> None:
        self.tokenizer, self.calls = tokenizer, []
        self.answers = {tuple(tokenizer.apply_chat_template(messages_of(row),
                                                            add_generation_prompt=True)
                              ["input_ids"]): row.answer for row in TRAIN_ROWS + VAL_ROWS}

    def request_extras(self, *names: str) -> None:
        from graft.rollout import refuse_extras

        refuse_extras(self.kind, names)

    def generate(self, prompts, spec):
        self.calls.append((spec, [list(p) for p in prompts]))
        out = []
        for index, ids in enumerate(prompts):
            answer = self.answers[tuple(ids)]
            text = answer if index % 2 == 0 or spec.temperature > 0 else answer + "1"
            response = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            out.append(RolloutSample(list(ids), [*response, self.tokenizer.eos_token_id], None))
        return out

    def sync_weights(self):
        return {}

    def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_chat_checkpoint(tmp_path_factory.mktemp("val") / "qwen3-chat")


def test_validation_metrics_and_samples_log(graft_plugin, chat_model: Path, tmp_path: Path,
                                            metrics_of) -> None:
    engines = []

    class Plugin:
        @hookimpl
        def graft_rollout_engines(self):
            return {"scripted": lambda *, tokenizer: engines.append(
                Scripted(tokenizer=tokenizer)) or engines[-1]}

    graft_plugin(Plugin(), name="scripted")
    train = write_verl_parquet(tmp_path / "train.parquet", TRAIN_ROWS)
    held_out = write_verl_parquet(tmp_path / "test.parquet", VAL_ROWS, split="test")
    run_dir = tmp_path / "run"
    graft.train(overrides=[
        f"trainer.run_dir={run_dir}", *QUIET, f"model.path={chat_model}", "data.source=file",
        f"data.path={train}", f"data.val_path={held_out}", "algorithm.reward=exact_match",
        "rollout.engine=scripted", "rollout.prompts_per_step=2", "rollout.n=2",
        "trainer.total_steps=3", "trainer.val_every_steps=2", "val.n=2", "val.max_prompts=3",
        "val.max_new_tokens=5", "trainer.log_samples=2"])
    rows = metrics_of(run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert set(rows[0]) == {"step", "val/reward_mean", "val/pass@2", "val/response_length"}
    assert "val/reward_mean" not in rows[1]
    (engine,) = engines
    tokenizer = engine.tokenizer
    lengths = [len(tokenizer(text, add_special_tokens=False)["input_ids"]) + 1
               for row in VAL_ROWS[:3] for text in (row.answer, row.answer + "1")]
    for row in (rows[0], rows[2], rows[3]):  # one right and one wrong answer per prompt
        assert row["val/reward_mean"] == 0.5 and row["val/pass@2"] == 1.0
        assert row["val/response_length"] == pytest.approx(sum(lengths) / len(lengths))
    validations = [(spec, prompts) for spec, prompts in engine.calls if spec.temperature == 0]
    assert len(validations) == 3 and all(spec.max_new_tokens == 5 for spec, _ in validations)
    expected = [ids for row in VAL_ROWS[:3] for ids in [tokenizer.apply_chat_template(
        messages_of(row), add_generation_prompt=True)["input_ids"]] * 2]
    assert all(prompts == expected for _, prompts in validations)

    records = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert [(r["step"], r["split"]) for r in records] == [
        (0, "val"), (0, "val"), (1, "train"), (1, "train"), (2, "train"), (2, "train"),
        (2, "val"), (2, "val"), (3, "train"), (3, "train"), (3, "val"), (3, "val")]
    first = records[0]
    assert first["prompt"] == tokenizer.apply_chat_template(messages_of(VAL_ROWS[0]),
                                                            add_generation_prompt=True,
                                                            tokenize=False)
    assert first["prompt"].startswith("<|im_start|>user\n")
    assert (first["response"], first["reward"], first["group_rewards"]) == \
        (VAL_ROWS[0].answer, 1.0, [1.0, 0.0])
    assert (first["ground_truth"], first["data_source"]) == (VAL_ROWS[0].answer, "openai/gsm8k")


def fake_rank(rank: int, size: int) -> SimpleNamespace:
    return SimpleNamespace(dp_rank=rank, dp_size=size, dp_group=None, device=torch.device("cpu"))


class Echo:
    """Answers every prompt with its own last token; keeps what it was asked."""

    def __init__(self) -> None:
        self.asked = []

    def generate(self, prompts, spec):
        self.asked.append(prompts)
        return [RolloutSample(p, p[-1:], None) for p in prompts]


def test_a_rank_without_held_out_prompts_generates_a_stand_in_and_counts_nothing() -> None:
    cfg = compose(["val.n=2"])
    prompts = Prompts([TextSample("a", "", "x"), TextSample("b", "", "y")], [[5, 6], [7]])
    scores = []

    def score(responses, samples):
        scores.append(list(zip(responses, [s.answer for s in samples], strict=True)))
        return [1.0] * len(responses)

    echo = Echo()
    sections = {"val": cfg.val, "trainer": cfg.trainer, "rollout": cfg.rollout}
    second = Validator(prompts, fake_rank(1, 2), **sections).run(echo, score=score, decode=str,
                                                                 step=0)
    assert echo.asked == [[[7], [7]]] and len(second.samples) == 2
    assert second.metrics["val/pass@2"] == 1.0 and second.metrics["val/response_length"] == 1.0
    idle = Validator(prompts, fake_rank(2, 3), **sections).run(echo, score=score, decode=str,
                                                               step=0)
    assert echo.asked[-1] == [[5, 6]]  # one stand-in, generated and dropped
    assert idle.samples == [] and idle.responses == [] and len(scores) == 1
    assert idle.metrics == {"val/reward_mean": 0.0, "val/pass@2": 0.0,
                            "val/response_length": 0.0}


def pattern_run(run_dir: Path, val_file: Path, *overrides: str) -> list[dict]:
    return graft.train(overrides=[
        f"trainer.run_dir={run_dir}", *QUIET, "model.preset=tiny-llama",
        "rollout.prompts_per_step=4", "rollout.n=4", "trainer.total_steps=3",
        f"data.val_path={val_file}", "data.val_answer_key=answer", *overrides])


def write_pattern_val(path: Path, count: int) -> Path:
    path.write_text("".join(json.dumps({"prompt": f"say {'ab'[i % 2] * (i + 1)}:",
                                        "answer": "abababab"}) + "\n" for i in range(count)))
    return path


def test_sampled_validation_leaves_the_training_losses_bit_identical(tmp_path: Path) -> None:
    held_out = write_pattern_val(tmp_path / "val.jsonl", 3)
    plain = pattern_run(tmp_path / "plain", held_out, "trainer.val_every_steps=0")
    validated = pattern_run(tmp_path / "val", held_out, "trainer.val_every_steps=1",
                            "val.temperature=1.0", "val.n=2")
    assert [m["step"] for m in validated] == [0, 1, 2, 3]
    keys = ("loss", "grad_norm", "reward_mean", "entropy", "train_infer_logprob_diff")
    assert [[m[k] for k in keys] for m in plain] == [[m[k] for k in keys] for m in validated[1:]]
    assert all("val/reward_mean" in m for m in validated)


@pytest.mark.slow  # two CLI processes, one of them 2 gloo ranks (~40 s idle)
def test_validation_over_two_ranks_counts_every_ranks_prompts(graft_train, tmp_path: Path) -> None:
    prompts = [f"say {'ab'[i % 2] * (i + 1)}:" for i in range(3)]  # ranks get 2 and 1 of them
    args = ("model.preset=tiny-llama", "rollout.prompts_per_step=2", "rollout.n=2",
            "trainer.total_steps=1", "data.val_answer_key=answer", "val.n=2",
            "trainer.log_samples=3", "algorithm.reward=exact_match", *QUIET[:3])

    def held_out(name: str, answers: list[str]) -> Path:
        path = tmp_path / name
        path.write_text("".join(json.dumps({"prompt": p, "answer": a}) + "\n"
                                for p, a in zip(prompts, answers, strict=True)))
        return path

    graft_train(tmp_path / "one", *args, f"data.val_path={held_out('a.jsonl', ['?'] * 3)}")
    greedy = [r["response"] for r in read_samples(tmp_path / "one") if r["split"] == "val"]
    # only the prompt rank 1 validates is answered as the model answers it
    right = held_out("b.jsonl", ["never said", greedy[1], "never said"])
    graft_train(tmp_path / "two", *args, f"data.val_path={right}", nproc=2)
    first = json.loads((tmp_path / "two" / "metrics.jsonl").read_text().splitlines()[0])
    assert first["step"] == 0
    assert first["val/reward_mean"] == pytest.approx(1 / 3) and first["val/pass@2"] == \
        pytest.approx(1 / 3)


def read_samples(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
