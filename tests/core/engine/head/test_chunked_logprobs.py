"""``engine.logprob_chunk_tokens``: log-probs and entropy from the hidden states a chunk of tokens
at a time (`graft.engine.head.chunked`) equal the whole-logits path on every preset family (fp32,
CPU, 1e-6), values and gradients; the chunk size changes nothing beyond rounding; the
``tokens x vocab`` logits are never formed, forward or backward."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from graft.config import ModelConfig
from graft.engine.batch.micro_batch import TokenSample, build_micro_batch
from graft.engine.forward import forward_logprobs
from graft.engine.head.chunked import chunked_head_logprobs
from graft.models import build_model
from graft.models.registry import model_families

PRESETS = sorted(name for family in model_families().values() for name in family.presets)
LENGTHS = (37, 11, 52)


def micro_batch(family, vocab: int):
    generator = torch.Generator().manual_seed(0)
    samples = [TokenSample([1, *torch.randint(3, vocab, (n,), generator=generator).tolist()], 4)
               for n in LENGTHS]
    return build_micro_batch(samples, packs_sequences=family.packs_sequences, pad_token_id=0,
                             temperatures=[0.7, 1.0, 1.3])


def autograd_entropy(model, family, batch) -> torch.Tensor:
    """The entropy by plain autograd from the model's whole logits (today's entropy has no
    gradient): the reference for the chunked entropy's gradient."""
    t = batch.tensors
    mask = (family.packed_attention_mask(model.config, t["position_ids"], torch.float32)
            if family.packs_sequences else None)
    logits = model(input_ids=t["input_ids"], position_ids=t["position_ids"], attention_mask=mask,
                   use_cache=False).logits
    log_p = torch.log_softmax(logits.float() / t["temperature"][..., None].float(), dim=-1)
    return -(log_p.exp() * log_p).sum(-1)


def grads_of(model, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def build(preset: str, **overrides):
    model, family = build_model(ModelConfig(preset=preset, overrides=overrides), seed=3)
    return model.float().train(), family


def assert_grads_close(actual: dict, expected: dict, what: str, rtol: float = 1e-6) -> None:
    """Every gradient within ``rtol`` of the expected one, relative to its norm (a gradient is
    a sum over tokens: the chunks change the order of that sum, element by element)."""
    assert actual.keys() == expected.keys(), what
    for name, grad in actual.items():
        error = float((grad - expected[name]).norm() / expected[name].norm().clamp_min(1e-30))
        assert error <= rtol, f"{what}: gradient of {name} off by {error:.2e} (relative)"


CHUNKS = (16, 33, 4096)  # several chunks with a ragged last one, and one chunk for all tokens


@pytest.mark.parametrize("preset, overrides", [*[(p, {}) for p in PRESETS],
                                               ("tiny-llama", {"tie_word_embeddings": True})])
def test_chunked_equals_whole_logits_on_every_family(preset: str, overrides: dict) -> None:
    model, family = build(preset, **overrides)
    batch = micro_batch(family, model.config.vocab_size)
    mask = batch.tensors["loss_mask"]
    weights = torch.randn(mask.shape, generator=torch.Generator().manual_seed(1)) * mask

    def run(chunk: int):
        logp, entropy = forward_logprobs(model, family, batch, compute_dtype=torch.float32,
                                         with_entropy=True, chunk_tokens=chunk)
        logp_grads = grads_of(model, (logp * weights).sum())
        if not chunk:
            return logp.detach(), entropy, logp_grads, None
        logp, entropy = forward_logprobs(model, family, batch, compute_dtype=torch.float32,
                                         with_entropy=True, chunk_tokens=chunk)
        return logp.detach(), entropy.detach(), logp_grads, grads_of(model, (entropy * mask).sum())

    logp, entropy, logp_grads, _ = run(0)  # today's path (its entropy has no gradient)
    entropy_grads = grads_of(model, (autograd_entropy(model, family, batch) * mask).sum())
    whole = run(max(CHUNKS))
    for chunk in CHUNKS:
        logp_c, entropy_c, logp_grads_c, entropy_grads_c = run(chunk)
        torch.testing.assert_close(logp_c, logp, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(entropy_c, entropy, rtol=1e-6, atol=1e-6)
        assert_grads_close(logp_grads_c, logp_grads, f"{preset} log-probs, chunk {chunk}")
        # the chunk size: one chunk against several, same formulas
        assert_grads_close(entropy_grads_c, whole[3], f"{preset} entropy, chunk {chunk}")
    # the analytic entropy gradient against autograd's: < 1e-6 apart on every family but
    # DeepSeek-V4, whose hyper-connection parameters amplify rounding (4e-5 apart; at the logits
    # both are 1e-6 from float64: test_entropy_gradient_matches_float64)
    assert_grads_close(whole[3], entropy_grads, f"{preset} entropy vs autograd", rtol=1e-4)


def test_entropy_gradient_matches_float64() -> None:
    """At the head, the chunked log-prob and entropy gradients are as close to float64
    autograd's as fp32 autograd is (about 1e-6, relative)."""
    generator = torch.Generator().manual_seed(0)
    tokens, hidden_size, vocab = 200, 64, 1000
    hidden = torch.randn(tokens, hidden_size, generator=generator) * 2
    head = torch.nn.Linear(hidden_size, vocab, bias=False)
    labels = torch.randint(0, vocab, (tokens,), generator=generator)
    temperature = torch.rand(tokens, generator=generator) + 0.5
    weights = torch.randn(2, tokens, generator=generator)

    def autograd(dtype: torch.dtype) -> list[torch.Tensor]:
        h = hidden.to(dtype).requires_grad_()
        w = head.weight.detach().to(dtype).requires_grad_()
        log_p = torch.log_softmax((h @ w.T) / temperature[:, None].to(dtype), dim=-1)
        logp = log_p.gather(1, labels[:, None]).squeeze(1)
        entropy = -(log_p.exp() * log_p).sum(-1)
        ((logp * weights[0] + entropy * weights[1]).sum()).backward()
        return [h.grad, w.grad]

    h = hidden.clone().requires_grad_()
    logp, entropy = chunked_head_logprobs(head, h, labels, temperature, chunk_tokens=16,
                                          with_entropy=True)
    ((logp * weights[0] + entropy * weights[1]).sum()).backward()
    exact = autograd(torch.float64)
    for chunked, fp32, reference in zip([h.grad, head.weight.grad], autograd(torch.float32), exact,
                                         strict=True):
        fp32_error = float((fp32.double() - reference).norm() / reference.norm())
        error = float((chunked.double() - reference).norm() / reference.norm())
        assert error <= max(2 * fp32_error, 1e-6), (error, fp32_error)


def test_one_chunk_is_bit_identical_to_whole_logits() -> None:
    """A micro-batch no longer than a chunk (the tests', the default 4096 on short RL batches)
    gives today's log-probs, entropy and gradients bit for bit."""
    model, family = build("tiny-llama")
    batch = micro_batch(family, model.config.vocab_size)
    runs = []
    for chunk in (0, 4096):
        logp, entropy = forward_logprobs(model, family, batch, compute_dtype=torch.float32,
                                         chunk_tokens=chunk, with_entropy=True)
        runs.append((logp, entropy.detach(),
                     grads_of(model, (logp * batch.tensors["loss_mask"]).sum())))
    (logp0, entropy0, grads0), (logp1, entropy1, grads1) = runs
    assert torch.equal(logp0, logp1) and torch.equal(entropy0, entropy1)
    assert all(torch.equal(grads0[n], grads1[n]) for n in grads0)


class LargestOutput(TorchDispatchMode):
    """The most elements any aten op returned while active (forward and backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("chunk", [0, 16])
def test_full_logits_never_allocated(chunk: int) -> None:
    """With a vocabulary larger than every other dimension, no tensor of forward or backward
    reaches ``tokens x vocab`` elements when chunked (the whole-logits path does, which shows
    the probe sees them); the largest is the embedding matrix."""
    vocab = 1024
    model, family = build("tiny-llama", vocab_size=vocab)
    batch = micro_batch(family, vocab)
    tokens = batch.tensors["input_ids"].numel()
    with LargestOutput() as probe:
        logp, entropy = forward_logprobs(model, family, batch, compute_dtype=torch.float32,
                                         with_entropy=True, chunk_tokens=chunk)
        (logp.sum() + entropy.sum()).backward()
    if chunk:
        assert probe.largest == vocab * model.config.hidden_size < tokens * vocab
    else:
        assert probe.largest >= tokens * vocab


def test_no_grad_phase_keeps_nothing() -> None:
    """Without gradients (old / reference log-probs) the chunked path builds no graph."""
    model, family = build("tiny-llama")
    batch = micro_batch(family, model.config.vocab_size)
    with torch.no_grad():
        logp, _ = forward_logprobs(model, family, batch, compute_dtype=torch.float32,
                                   chunk_tokens=8)
    assert logp.grad_fn is None and not logp.requires_grad
