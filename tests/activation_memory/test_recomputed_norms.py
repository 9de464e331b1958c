"""Recomputed norms (`graft_activation_memory.recomputed_norms`) on the norms of real tiny
models: a recomputed norm keeps only its input, gives the same output and gradients, and runs
on chunks of tokens."""

from __future__ import annotations

import pytest
import torch

from graft.config import compose
from graft.models.build import build_model
from graft_activation_memory import recomputed_norms
from graft_activation_memory.recomputed_norms import apply_recomputed_norms, block_norms, final_norm


def saved_bytes(run) -> int:
    """Bytes of the tensors autograd saves while ``run()`` runs (each storage once)."""
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if not isinstance(tensor, torch.nn.Parameter):
            storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        run()
    return sum(storages.values())


def test_a_recomputed_norm_keeps_only_its_input() -> None:
    """A bf16 RMSNorm of the tiny Qwen3-MoE's blocks (its own fp32 arithmetic inside): recomputed,
    it saves its input alone and still gives the same output and gradients (recomputed in
    backward from that input)."""
    cfg = compose(["model.preset=tiny-qwen3-moe", "engine.device=cpu"])
    model, family = build_model(cfg.model, seed=0)
    blocks = list(family.decoder_blocks(model.bfloat16()))
    norms = block_norms(blocks)
    assert len(norms) == 4 * len(blocks)  # input, post-attention, q and k norms
    x = torch.randn(2, 8, model.config.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    norm = blocks[0].input_layernorm
    plain_out, recomputed = {}, {}

    def backward(into: dict) -> None:
        into["bytes"] = saved_bytes(lambda: into.setdefault("out", norm(x)))
        into["grads"] = torch.autograd.grad(into["out"].float().square().sum(), [x, norm.weight])

    backward(plain_out)
    apply_recomputed_norms(blocks)
    backward(recomputed)
    assert recomputed["bytes"] == x.numel() * 2  # the bf16 input, nothing in fp32
    assert plain_out["bytes"] >= x.numel() * (4 + 2)  # its fp32 input and bf16 normalised values
    assert torch.equal(recomputed["out"], plain_out["out"])
    assert all(torch.equal(a, b) for a, b in zip(recomputed["grads"], plain_out["grads"],
                                                  strict=True))
    assert final_norm(model) == [model.model.norm]


def test_a_recomputed_norm_over_several_chunks_of_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of 5 of 16 tokens: the same output bit for bit, the same gradients within
    rounding (the weight's is a sum over the chunks)."""
    cfg = compose(["model.preset=tiny-llama", "engine.device=cpu"])
    model, _ = build_model(cfg.model, seed=0)
    norm = model.model.norm
    x = torch.randn(2, 8, model.config.hidden_size, requires_grad=True)
    plain = norm(x)
    plain_grads = torch.autograd.grad(plain.square().sum(), [x, norm.weight])
    monkeypatch.setattr(recomputed_norms, "NORM_CHUNK_TOKENS", 5)
    recomputed_norms.apply_recomputed_norms([norm])
    calls: list[int] = []
    per_chunk = recomputed_norms._norm_grads
    monkeypatch.setattr(recomputed_norms, "_norm_grads", lambda *a: calls.append(1) or
                        per_chunk(*a))
    out = norm(x)
    grads = torch.autograd.grad(out.square().sum(), [x, norm.weight])
    assert torch.equal(out, plain) and len(calls) == 4  # 16 tokens: 5 + 5 + 5 + 1
    for got, want in zip(grads, plain_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
