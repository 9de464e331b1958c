"""Greedy decoding (temperature 0, validation's default) in the embedded engine: transformers'
``generate`` (dynamic decode, and the static copy's with ``rollout.decode_compile=none``) emits
the model's most likely token at every position, reports log-probs at temperature 1 and draws no
random numbers (graft-graphed-decode's loop: tests/graphed_decode/test_plugin.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from graft.config import compose
from graft.rollout import SamplingSpec
from graft.training.trainer import Trainer

GREEDY = SamplingSpec(0.0, 1.0, 6)
PROMPTS = [[1, 70, 83], [1, 20, 21, 22, 23], [1, 44]]


@pytest.mark.parametrize("decode", ["dynamic", "static"])
def test_greedy_samples_are_the_most_likely_tokens_and_draw_no_random_numbers(
        tmp_path: Path, decode: str) -> None:
    trainer = greedy_trainer(tmp_path, f"rollout.decode={decode}", "rollout.decode_compile=none")
    try:
        assert trainer.job.rollout.decoder is None  # transformers' generate
        assert_greedy(trainer)
    finally:
        trainer.job.close()


def greedy_trainer(run_dir: Path, *overrides: str) -> Trainer:
    """The tiny Llama's RL trainer on CPU."""
    return Trainer(compose([f"trainer.run_dir={run_dir}", "engine.device=cpu",
                            "model.preset=tiny-llama", "export.hf_at_end=false", *overrides]))


def assert_greedy(trainer: Trainer) -> None:
    """``trainer``'s rollout generates greedily: the most likely tokens of the trained model,
    their log-probs at temperature 1, no random number drawn, the same tokens again."""
    rollout = trainer.job.rollout
    state = torch.random.get_rng_state()
    samples = rollout.generate(PROMPTS, GREEDY)
    assert torch.equal(torch.random.get_rng_state(), state)
    model = trainer.engine.model
    for sample in samples:
        sequence = torch.tensor([sample.prompt_ids + sample.response_ids])
        with torch.no_grad():
            logits = model(input_ids=sequence).logits[0, len(sample.prompt_ids) - 1:-1]
        response = torch.tensor(sample.response_ids)
        assert torch.equal(response, logits.argmax(-1))
        expected = logits.float().log_softmax(-1).gather(-1, response[:, None]).squeeze(-1)
        torch.testing.assert_close(sample.logprobs, expected, rtol=0, atol=2e-5)
    again = rollout.generate(PROMPTS, GREEDY)
    assert [s.response_ids for s in again] == [s.response_ids for s in samples]
