"""Validation and the samples log end to end on CPU, nothing downloaded, scored by math-verify:
``graft train`` on a local Qwen3-style checkpoint with verl-layout train and test parquets writes
``val/*`` rows and ``samples.jsonl`` and says what it does on the console; and on a task a tiny
model can learn (repeat the number in the prompt), ``val/reward_mean`` rises."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

import graft
from graft.testing.chat import (
    CHAT_TEMPLATE,
    gsm8k_rows,
    messages_of,
    write_chat_checkpoint,
    write_verl_parquet,
)

QUIET = ("checkpoint.every_steps=0", "checkpoint.save_at_end=false", "export.hf_at_end=false")


@pytest.mark.slow  # a CLI process with math-verify workers (~30 s idle)
def test_graft_train_validates_and_logs_samples(graft_train, metrics_of, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    model = write_chat_checkpoint(tmp_path / "qwen3-chat")
    train = write_verl_parquet(tmp_path / "train.parquet", gsm8k_rows(8, seed=1))
    held_out = gsm8k_rows(3, seed=2)
    test = write_verl_parquet(tmp_path / "test.parquet", held_out, split="test")
    run_dir = tmp_path / "run"
    result = graft_train(run_dir, f"model.path={model}", "data.source=file", f"data.path={train}",
                         f"data.val_path={test}", "algorithm.reward=math",
                         "features.reward_pool.workers=1", "rollout.prompts_per_step=2", "rollout.n=2",
                         "rollout.max_new_tokens=6", "trainer.total_steps=2",
                         "trainer.val_every_steps=1", "trainer.log_samples=1",
                         "trainer.print_sample_every_steps=1", *QUIET)
    rows = metrics_of(run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2]
    for row in rows:
        assert 0.0 <= row["val/reward_mean"] <= row["val/pass@1"] <= 1.0
        assert 0 < row["val/response_length"] <= 6
    assert rows[1]["time_to_first_step_s"] > 0
    records = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert [(r["step"], r["split"]) for r in records] == [
        (0, "val"), (1, "train"), (1, "val"), (2, "train"), (2, "val")]
    tokenizer = AutoTokenizer.from_pretrained(model)
    rendered = tokenizer.apply_chat_template(messages_of(held_out[0]), tokenize=False,
                                             add_generation_prompt=True)
    assert records[0]["prompt"] == rendered and records[0]["ground_truth"] == held_out[0].answer
    assert records[0]["data_source"] == "openai/gsm8k"
    stdout = result.stdout
    assert "validation (step 0): reward_mean " in stdout and "pass@1 " in stdout
    assert "sample (step 1, train): reward " in stdout and "time to first step: " in stdout
    assert "# resolved on cpu (graft.config.auto):" in (run_dir / "config.yaml").read_text()


def repeat_checkpoint(folder: Path) -> Path:
    """A tiny random Qwen3 with Qwen's chat template and a BPE tokenizer of 40 tokens trained on
    the task's words (a byte-level BPE starts at 256 tokens: a random model would rarely say a
    digit, and the reward would never come)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, trainers
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    core = Tokenizer(models.BPE(unk_token="<unk>"))
    core.decoder = decoders.Fuse()
    corpus = ["user", "assistant", "repeat"] * 50 + [f"repeat {n}" for n in range(10)] + ["\n"]
    specials = ["<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    core.train_from_iterator(corpus, trainer=trainers.BpeTrainer(vocab_size=40,
                                                                 special_tokens=specials))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>",
                                        eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.chat_template = CHAT_TEMPLATE
    config = AutoConfig.for_model(
        "qwen3", vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        max_position_embeddings=64, tie_word_embeddings=True, bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def write_repeat_parquet(path: Path, numbers: list[int]) -> Path:
    """verl's layout: "repeat N" as a chat message, N the ground truth."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([
        {"data_source": "repeat", "prompt": [{"role": "user", "content": f"repeat {n}"}],
         "reward_model": {"style": "rule", "ground_truth": str(n)}} for n in numbers]), path)
    return path


@pytest.mark.slow  # 40 RL steps (~60-90 s on 2 idle cores)
def test_val_reward_rises_when_the_model_learns_to_repeat_the_number(tmp_path: Path) -> None:
    model = repeat_checkpoint(tmp_path / "repeat-model")
    rng = random.Random(0)
    train = write_repeat_parquet(tmp_path / "train.parquet", [rng.randrange(5) for _ in range(256)])
    test = write_repeat_parquet(tmp_path / "test.parquet", list(range(5)))
    metrics = graft.train(overrides=[
        f"trainer.run_dir={tmp_path / 'run'}", "engine.device=cpu", f"model.path={model}",
        "data.source=file", f"data.path={train}", f"data.val_path={test}",
        "algorithm.reward=math", "features.reward_pool.kind=thread", "features.reward_pool.workers=1",
        "rollout.prompts_per_step=4", "rollout.n=16", "rollout.max_new_tokens=1",
        "engine.max_tokens_per_row=512", "optim.lr=1e-2", "trainer.total_steps=40",
        "trainer.val_every_steps=10", "trainer.print_sample_every_steps=0", *QUIET])
    val = [m["val/reward_mean"] for m in metrics if "val/reward_mean" in m]
    assert len(val) == 5  # steps 0, 10, 20, 30, 40
    # greedy at step 0: one digit for every prompt (at most 1 of 5 right); then the model copies
    assert val[0] <= 0.2 and val[-1] >= val[0] + 0.4, val
