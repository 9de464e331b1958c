"""Fixtures: a tiny random Llama with a word-level tokenizer of the calculator's vocabulary
(digits, operators, the tool's tags as single tokens), saved as a local Hugging Face
checkpoint; and one whose tokenizer has the Hermes-style chat template of
graft_multiturn.templates (hermes), its pieces as single tokens (as a BPE trained on such
conversations merges them: the tool list, the call up to its expression, the call's end)."""

from __future__ import annotations

from pathlib import Path

import pytest
from graft_multiturn.templates import chat_template

CALL_OPEN = '<tool_call>{"name": "calculator", "arguments": {"expression": "'
CALL_CLOSE = '"}}</tool_call>'
SPECIAL = ["<|im_start|>", "<|im_end|>"]

TOKENS = ["<pad>", "<eos>", "<unk>", *"0123456789", "+", "-", "*", "=", ".", "<calc>", "</calc>",
          "<result>", "</result>"]


def hermes_pieces() -> list[str]:
    """The Hermes vocabulary: the template's pieces, the tool list and the call as the
    calculator's schema renders them, digits and operators."""
    import json

    from graft_calculator import calculator
    from graft_multiturn.tools import Tool

    tools = json.dumps(Tool(calculator).schema, ensure_ascii=False)
    return ["<pad>", "<unk>", *SPECIAL, "system\n", "user\n", "assistant\n", "\n", "<tools>",
            tools, "</tools>", CALL_OPEN, CALL_CLOSE, "<tool_response>\n", "\n</tool_response>",
            *"0123456789", "+", "-", "*", "=", "."]


def calculator_checkpoint(folder: Path, hermes: bool = False) -> Path:
    """The checkpoint's folder (model and tokenizer): ``<calc>`` tags, or with ``hermes`` the
    Hermes-style chat template."""
    import re

    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    tokens = hermes_pieces() if hermes else TOKENS
    core = Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate(tokens)},
                                      unk_token="<unk>"))
    words = sorted((t for t in tokens if len(t) > 1), key=len, reverse=True)
    pattern = "|".join(map(re.escape, words)) + r"|[\s\S]" if hermes else r"</?calc>|</?result>|."
    core.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    core.decoder = decoders.Fuse()
    if hermes:
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>",
                                            eos_token="<|im_end|>", pad_token="<pad>",
                                            additional_special_tokens=SPECIAL[:1])
        tokenizer.chat_template = chat_template("hermes")
    else:
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>",
                                            eos_token="<eos>", pad_token="<pad>")
    config = AutoConfig.for_model(
        "llama", vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        max_position_embeddings=64, tie_word_embeddings=True, bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def calculator_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`calculator_checkpoint` in a folder of the session."""
    return calculator_checkpoint(tmp_path_factory.mktemp("calculator") / "model")


@pytest.fixture(scope="session")
def hermes_calculator_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`calculator_checkpoint` with the Hermes-style chat template."""
    return calculator_checkpoint(tmp_path_factory.mktemp("hermes-calculator") / "model",
                                 hermes=True)
