"""Packing samples into one row gives the same log-probs and gradients as running them alone."""

from __future__ import annotations

import pytest
import torch

from graft.config import ModelConfig
from graft.engine.forward import forward_logprobs
from graft.engine.micro_batch import TokenSample, build_micro_batch
from graft.models import build_model

PRESETS = ["tiny-llama", "tiny-qwen3-moe", "tiny-gpt-oss", "tiny-deepseek-v3", "tiny-deepseek-v4"]


def make_samples(seed: int) -> list[TokenSample]:
    generator = torch.Generator().manual_seed(seed)
    samples = []
    for length in (23, 9, 31, 14):
        ids = torch.randint(3, 100, (length,), generator=generator).tolist()
        samples.append(TokenSample([1, *ids], response_start=4))
    return samples


def logprobs_and_grads(model, family, samples, *, pad_bucket=None):
    model.zero_grad()
    batch = build_micro_batch(samples, packs_sequences=family.packs_sequences, pad_token_id=0,
                              pad_bucket=pad_bucket)
    logp, _ = forward_logprobs(model, family, batch, compute_dtype=torch.float32)
    (logp * batch.tensors["loss_mask"]).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return batch.layout.unpad(logp.detach()), grads


@pytest.mark.parametrize("preset", PRESETS)
def test_packed_equals_unpacked(preset: str) -> None:
    model, family = build_model(ModelConfig(preset=preset), seed=0)
    samples = make_samples(0)
    packed, packed_grads = logprobs_and_grads(model, family, samples, pad_bucket=64)
    alone_grads: dict[str, torch.Tensor] = {}
    for index, sample in enumerate(samples):
        (alone,), grads = logprobs_and_grads(model, family, [sample])
        torch.testing.assert_close(packed[index], alone, rtol=1e-5, atol=1e-5)
        for name, grad in grads.items():
            alone_grads[name] = alone_grads.get(name, 0) + grad
    assert packed_grads.keys() == alone_grads.keys()
    for name, grad in packed_grads.items():
        torch.testing.assert_close(grad, alone_grads[name], rtol=1e-4, atol=1e-5, msg=name)
