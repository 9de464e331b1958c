"""Fixtures: graft-multiturn's chat templates that behave like the public families
(`graft_multiturn.templates`: append-only Hermes/Qwen2.5-style with tools, a thinking template
that drops earlier ``<think>`` blocks like Qwen3.5, harmony-style channels like GPT-OSS), each with a small
byte-level BPE tokenizer trained here on its own renderings (the ``tokenizers`` library, no
downloads), and a scripted rollout engine that generates given token ids turn by turn."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from graft_multiturn.templates import chat_template

CHATML = {"special": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
          "added": ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
                    "<think>", "</think>", "<tools>", "</tools>"],
          "eos": "<|im_end|>", "pad": "<|endoftext|>"}
FAMILIES = {
    "hermes": CHATML, "thinking": CHATML,
    "harmony": {"special": ["<|endoftext|>", "<|start|>", "<|message|>", "<|channel|>",
                            "<|constrain|>", "<|end|>", "<|call|>", "<|return|>"],
                "added": [], "eos": "<|return|>", "pad": "<|endoftext|>"},
}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two numbers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "number"},
                                                    "b": {"type": "number"}},
                   "required": ["a", "b"]}}}
CORPUS_TEXT = ("What is 2+3? The sum of two numbers is their total; let me add them. "
               "The answer is 5. Hello world, 0123456789 +-*/=.,:;!?\"'{}[]()<>_")


def train_tokenizer(family: str) -> Any:
    """A byte-level BPE of 400 tokens trained on ``family``'s renderings, with its special
    tokens (and its non-special added tags, as Qwen's tokenizer holds ``<tool_call>``)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    spec = FAMILIES[family]
    template = chat_template(family)
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=spec["special"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    plain = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()))
    plain.chat_template = template
    corpus = [CORPUS_TEXT] * 5 + [plain.apply_chat_template(
        conversation(family), tools=[ADD], tokenize=False)] * 20
    core.train_from_iterator(corpus, trainer)
    core.add_tokens([AddedToken(t, special=False, normalized=False) for t in spec["added"]])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, eos_token=spec["eos"],
                                        pad_token=spec["pad"],
                                        additional_special_tokens=spec["special"][1:])
    tokenizer.chat_template = template
    return tokenizer


def conversation(family: str) -> list[dict[str, Any]]:
    """A whole conversation of ``family`` with a call, its result and the answer."""
    call = [{"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]
    thought = {"harmony": "thinking"}.get(family, "reasoning_content")
    return [{"role": "user", "content": "What is 2+3?"},
            {"role": "assistant", "content": "", thought: "let me add", "tool_calls": call},
            {"role": "tool", "name": "add", "content": "5"},
            {"role": "assistant", "content": "The answer is 5."}]


@pytest.fixture(scope="session")
def chat_tokenizers() -> dict[str, Any]:
    """Each family's trained tokenizer, with its chat template."""
    return {family: train_tokenizer(family) for family in FAMILIES}


class ScriptedEngine:
    """A `graft.rollout.RolloutEngine` whose model generates the given turns (token ids, in
    order, for a single episode), each with made-up log-probs; records every context."""

    kind, model, llm = "scripted", None, None

    def __init__(self, turns: list[list[int]]) -> None:
        self.turns, self.contexts = [list(t) for t in turns], []

    def request_extras(self, *names: str) -> None:
        pass

    def generate(self, contexts: list[list[int]], spec: Any) -> list[Any]:
        from graft.rollout import RolloutSample

        (context,) = contexts
        self.contexts.append(list(context))
        ids = self.turns[len(self.contexts) - 1]
        logprobs = -torch.arange(1, len(ids) + 1, dtype=torch.float32) / 100
        return [RolloutSample(list(context), ids, logprobs)]


@pytest.fixture
def scripted_engine() -> type[ScriptedEngine]:
    return ScriptedEngine
