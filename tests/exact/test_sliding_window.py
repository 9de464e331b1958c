"""Sliding-window attention under ``features.exact.enabled``: the exact attention applies the
window (as transformers' eager attention does), and Mistral- and Gemma-3-style models whose
window is shorter than their sequences sample exactly what the trainer computes (mismatch 0.0,
exact fraction 1.0 on every step, with either decode path, whose sliding caches then drop
keys); linear attention is a config error that names what is missing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from graft.config import compose
from graft.errors import ConfigError
from graft.testing import write_chat_checkpoint
from graft.training.trainer import Trainer

RUN = ("engine.device=cpu", "checkpoint.every_steps=0", "checkpoint.save_at_end=false",
       "export.hf_at_end=false", "trainer.print_sample_every_steps=0",
       "features.exact.enabled=true", "trainer.total_steps=2")
WINDOW = 8  # keys a query attends: fewer than the runs' prompts plus responses
WINDOWED = {"mistral": {}, "gemma3_text": {"layer_types": ["sliding_attention", "full_attention"],
                                           "query_pre_attn_scalar": 16}}


def windowed_checkpoint(folder: Path, model_type: str, window: int) -> Path:
    """A tiny random ``model_type`` model with ``sliding_window=window`` and the chat
    tokenizer of `graft.testing.write_chat_checkpoint`, saved as a Hugging Face directory."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    write_chat_checkpoint(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    config = AutoConfig.for_model(
        model_type, vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        max_position_embeddings=1024, sliding_window=window, bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        **WINDOWED[model_type])
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return folder


@pytest.mark.slow
# each family and each decode path once: transformers' static sliding cache (the decode copy)
# and its dynamic one (generate on the trained model) drop keys each their own way
@pytest.mark.parametrize(("model_type", "decode"), [("mistral", "dynamic"),
                                                    ("gemma3_text", "static")])
def test_a_window_shorter_than_the_sequences_samples_exactly(tmp_path: Path, model_type: str,
                                                             decode: str) -> None:
    folder = windowed_checkpoint(tmp_path / "model", model_type, window=WINDOW)
    cfg = compose([f"model.path={folder}", f"trainer.run_dir={tmp_path / 'run'}", *RUN,
                   f"rollout.decode={decode}", "rollout.max_new_tokens=24"])
    rows = Trainer(cfg).fit()
    assert min(r["response_length"] for r in rows) > WINDOW  # the caches dropped keys
    assert [(r["train_infer_logprob_diff"], r["train_infer_logprob_exact_fraction"])
            for r in rows] == [(0.0, 1.0)] * 2


@pytest.mark.parametrize("model_type", sorted(WINDOWED))
def test_the_exact_attention_applies_the_window(tmp_path: Path, model_type: str) -> None:
    from graft_exact.attention import EXACT_ATTENTION, register_exact_attention
    from transformers import AutoModelForCausalLM

    register_exact_attention()
    folder = windowed_checkpoint(tmp_path / "model", model_type, window=WINDOW)
    tokens = torch.randint(3, 60, (2, 4 * WINDOW), generator=torch.Generator().manual_seed(0))
    logits = {}
    for name, implementation, window in [("eager", "eager", WINDOW),
                                         ("exact", EXACT_ATTENTION, WINDOW),
                                         ("unwindowed", "eager", 4096)]:
        model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation=implementation,
                                                     sliding_window=window).eval()
        with torch.no_grad():
            logits[name] = model(tokens).logits
    torch.testing.assert_close(logits["exact"], logits["eager"], rtol=0, atol=1e-5)
    assert (logits["unwindowed"] - logits["eager"])[:, WINDOW:].abs().max() > 1e-2


def test_linear_attention_is_refused_naming_it() -> None:
    from graft_exact import check_exact_support
    from transformers import AutoConfig

    with pytest.raises(ConfigError, match="linear_attention layers compute no softmax"):
        check_exact_support(AutoConfig.for_model("qwen3_next"))
