"""Fixtures: a tiny random Llama with a word-level tokenizer of the calculator's vocabulary
(digits, operators, the tool's tags as single tokens), saved as a local Hugging Face
checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

TOKENS = ["<pad>", "<eos>", "<unk>", *"0123456789", "+", "-", "*", "=", ".", "<calc>", "</calc>",
          "<result>", "</result>"]


def calculator_checkpoint(folder: Path) -> Path:
    """The checkpoint's folder (model and tokenizer)."""
    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate(TOKENS)},
                                      unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"</?calc>|</?result>|."), behavior="isolated")
    core.decoder = decoders.Fuse()
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
