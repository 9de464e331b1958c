"""A local chat checkpoint and math datasets for tests, made on the spot (no downloads).

* `write_chat_checkpoint(folder)`: a Hugging Face directory as a user brings it: a byte-level
  BPE tokenizer trained here with ``tokenizers``, Qwen's chat template (``<|im_start|>role ...
  <|im_end|>``), and a tiny random Qwen3 (hidden 64, 2 layers) sized to its vocabulary.
* `gsm8k_rows(count)`: synthetic GSM8K-style word problems with their answers.
* `write_verl_parquet(path, rows)`: the rows in verl's RL layout (``prompt`` as chat messages,
  ``reward_model`` a struct with ``ground_truth``, ``data_source``, ``extra_info``).
* `write_trl_jsonl(path, rows)`: the rows in TRL's layout (``prompt`` text or messages,
  ``solution``).

Imports torch and transformers when called (not at import).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["CHAT_TEMPLATE", "MathRow", "gsm8k_rows", "write_chat_checkpoint", "write_trl_jsonl",
           "write_verl_parquet"]

# Qwen2.5/Qwen3's template without tools and thinking: every message as
# <|im_start|>{role}\n{content}<|im_end|>\n, then the assistant's header as the generation prompt.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
NAMES = ("Ada", "Ben", "Cleo", "Dev", "Eli", "Fay")
THINGS = ("apples", "books", "coins", "pens", "shells", "stamps")


@dataclass(frozen=True)
class MathRow:
    """One word problem: the question and its answer (a whole number, as text)."""

    question: str
    answer: str


def gsm8k_rows(count: int, seed: int = 0) -> list[MathRow]:
    """``count`` reproducible GSM8K-style problems ("Ada has 3 apples and buys 4 more...")."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        name, thing = rng.choice(NAMES), rng.choice(THINGS)
        a, b = rng.randint(2, 40), rng.randint(2, 40)
        rows.append(MathRow(f"{name} has {a} {thing} and gets {b} more. How many {thing} does "
                            f"{name} have now?", str(a + b)))
    return rows


def _corpus() -> list[str]:
    """Text the tokenizer learns from: the problems, boxed and GSM8K answers, chat roles."""
    lines = [row.question for row in gsm8k_rows(200, seed=123)]
    lines += [f"The answer is \\boxed{{{n}}}. #### {n}" for n in range(100)]
    lines += ["system user assistant Let's think step by step and put the final answer in "
              "\\boxed{}.", "Repeat the number in \\boxed{}: 17 + 25 = 42"]
    return lines


def train_tokenizer(vocab_size: int = 512) -> Any:
    """A byte-level BPE `PreTrainedTokenizerFast` with Qwen's special tokens and chat template
    (no bos; ``<|im_end|>`` ends a turn and is eos; ``<|endoftext|>`` pads)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    core.train_from_iterator(_corpus(), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>",
                                        pad_token="<|endoftext|>")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def write_chat_checkpoint(folder: str | Path, *, seed: int = 0,
                          chat_template: bool | str = True) -> Path:
    """Save a tiny random Qwen3 (hidden 64, 2 layers, 4 heads of 16, 2 KV heads) and a BPE
    tokenizer with Qwen's chat template (another with ``chat_template=TEMPLATE``, such as a
    tool-calling one; none with ``chat_template=False``) as a Hugging Face directory; return
    it."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = Path(folder)
    tokenizer = train_tokenizer()
    if chat_template is not True:
        tokenizer.chat_template = chat_template or None
    config = AutoConfig.for_model(
        "qwen3", vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        max_position_embeddings=1024, tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def messages_of(row: MathRow, *, system: bool = False) -> list[dict[str, str]]:
    """The chat messages asking ``row``'s question (the answer to go in ``\\boxed{}``)."""
    ask = {"role": "user", "content": f"{row.question} Put the final answer in \\boxed{{}}."}
    return ([{"role": "system", "content": "You are a helpful assistant."}] if system
            else []) + [ask]


def write_verl_parquet(path: str | Path, rows: list[MathRow], *,
                       data_source: str = "openai/gsm8k", split: str = "train") -> Path:
    """``rows`` in verl's RL layout, as its ``examples/data_preprocess/gsm8k.py`` writes them:
    ``data_source``, ``prompt`` (a list of chat messages), ``ability``, ``reward_model``
    (struct: ``style``, ``ground_truth``) and ``extra_info`` (struct: ``split``, ``index``,
    ``answer``, ``question``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist([{
        "data_source": data_source,
        "prompt": messages_of(row),
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": row.answer},
        "extra_info": {"split": split, "index": index, "answer": f"#### {row.answer}",
                       "question": row.question},
    } for index, row in enumerate(rows)])
    pq.write_table(table, path)
    return Path(path)


def write_trl_jsonl(path: str | Path, rows: list[MathRow], *, chat: bool = True) -> Path:
    """``rows`` in TRL's layout: ``prompt`` (chat messages, or the question as text with
    ``chat=False``) and ``solution``."""
    with Path(path).open("w", encoding="utf-8") as handle:
        for row in rows:
            prompt = messages_of(row) if chat else row.question
            handle.write(json.dumps({"prompt": prompt, "solution": row.answer}) + "\n")
    return Path(path)
