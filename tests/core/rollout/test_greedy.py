"""Greedy decoding (temperature 0, validation's default) in the embedded engine: transformers'
``generate`` (dynamic decode) and Graft's own loop (static decode, eager on CPU) both emit the
model's most likely token at every position, report log-probs at temperature 1 and draw no
random numbers."""

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
    cfg = compose([f"trainer.run_dir={tmp_path}", "engine.device=cpu", "model.preset=tiny-llama",
                   f"rollout.decode={decode}", "export.hf_at_end=false"])
    trainer = Trainer(cfg)
    try:
        rollout = trainer.job.rollout
        assert (rollout.decoder is not None) == (decode == "static")  # Graft's own loop
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
    finally:
        trainer.job.close()
