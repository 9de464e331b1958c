"""The installed plugin through Graft: its hooks and section, the old ``engine.*`` keys, the
policy tiled and the reference left alone, and the core's fused head with the long-context
settings on FSDP2."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import graft
from graft.engine.batch.micro_batch import TokenSample, build_micro_batch
from graft.engine.distributed.env import init_distributed
from graft.engine.distributed.parallelize import parallelize
from graft.engine.forward import forward_fused_loss, forward_logprobs
from graft.engine.head.token_loss import chunk_token_loss, token_weights
from graft.models.build import build_model
from graft.testing import (
    AggregationContext,
    check_config_section,
    check_installed_plugin,
    check_moved_key,
)
from graft.training.sft import sft_loss
from graft_activation_memory import ActivationMemoryConfig
from graft_activation_memory.recomputed_norms import RECOMPUTED_ATTRIBUTE
from graft_activation_memory.tiled_mlp import TILED_ATTRIBUTE

LONG_CONTEXT = ["engine.activation_checkpointing=true", "engine.checkpoint_every_blocks=2",
                "features.activation_memory.mlp_chunk_tokens=16",
                "features.activation_memory.recompute_norms=true"]


def test_the_installed_plugin_passes_graft_testing() -> None:
    assert set(check_installed_plugin("activation_memory")) == {"graft_config_sections",
                                                                 "graft_pre_shard"}
    assert check_config_section("activation_memory", ActivationMemoryConfig) == {
        "mlp_chunk_tokens": 0, "recompute_norms": False}


@pytest.mark.parametrize("old, value", [("mlp_chunk_tokens", "8192"), ("recompute_norms", "true")])
def test_an_old_engine_key_names_its_new_home(old: str, value: str, tmp_path: Path) -> None:
    check_moved_key(f"engine.{old}", f"features.activation_memory.{old}", value, tmp_path)


def test_a_saved_config_with_the_old_defaults_still_composes(tmp_path: Path) -> None:
    """A config.yaml of an earlier version lists every key at its default."""
    (tmp_path / "config.yaml").write_text("engine:\n  mlp_chunk_tokens: 0\n"
                                          "  recompute_norms: false\n  compile: false\n")
    cfg = graft.compose(config_files=[tmp_path / "config.yaml"])
    assert cfg.features.activation_memory == ActivationMemoryConfig()


@pytest.mark.parametrize("role, applied", [("policy", True), ("reference", False)])
def test_the_policy_is_changed_and_the_reference_left_alone(role: str, applied: bool) -> None:
    env = init_distributed(device_preference="cpu")
    cfg = graft.compose(["model.preset=tiny-qwen3-moe", "engine.device=cpu",
                         "+model.overrides.mlp_only_layers=[0]", *LONG_CONTEXT])
    model, family = build_model(cfg.model, seed=0)
    parallelize(model, family, cfg=cfg, mesh=env.mesh, device=env.device, role=role)
    tiled = [hasattr(block.mlp, TILED_ATTRIBUTE) for block in family.decoder_blocks(model)]
    assert tiled == [applied, False]  # the dense MLP of layer 0; the MoE layer's stays whole
    assert hasattr(model.model.norm, RECOMPUTED_ATTRIBUTE) is applied


def head_loss_and_grads(fuse: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """An SFT micro-batch's token-mean loss through the chunked head (16 tokens a chunk) of
    the tiny Llama parallelized with the long-context settings; the head's backward, or the
    loss's gradient taken in its forward (``fuse``)."""
    env = init_distributed(device_preference="cpu")
    cfg = graft.compose(["model.preset=tiny-llama", "engine.device=cpu", *LONG_CONTEXT])
    model, family = build_model(cfg.model, seed=0)
    model = parallelize(model.float(), family, cfg=cfg, mesh=env.mesh, device=env.device).train()
    generator = torch.Generator().manual_seed(0)
    batch = build_micro_batch([TokenSample([1, *torch.randint(3, 100, (n,), generator=generator)
                                            .tolist()], n // 3) for n in (37, 11, 52)],
                              packs_sequences=family.packs_sequences, pad_token_id=0)
    weights = token_weights(batch, "token-mean", AggregationContext(
        global_tokens=70.0, global_sequences=3.0, dp_size=1, loss_scale_factor=1.0))
    if fuse:
        _, _, loss = forward_fused_loss(model, family, batch,
                                        chunk_token_loss(sft_loss, batch, weights),
                                        compute_dtype=torch.float32, chunk_tokens=16)
    else:
        logp, _ = forward_logprobs(model, family, batch, compute_dtype=torch.float32,
                                   chunk_tokens=16)
        loss = -(logp * weights).sum()
    loss.backward()
    return loss.detach(), {n: p.grad.full_tensor() for n, p in model.named_parameters()}


def test_the_fused_head_with_the_long_context_settings_on_fsdp2() -> None:
    """The fused head's loss and gradients are the chunked head's with the tiled MLP, recomputed
    norms and checkpoint groups: the recomputed final norm gets the hidden states' gradient
    from the head's forward."""
    loss, grads = head_loss_and_grads(fuse=False)
    loss_f, grads_f = head_loss_and_grads(fuse=True)
    torch.testing.assert_close(loss_f, loss, rtol=1e-6, atol=1e-7)
    assert grads_f.keys() == grads.keys()
    for name, grad in grads_f.items():
        error = float((grad - grads[name]).norm() / grads[name].norm().clamp_min(1e-30))
        assert error <= 1e-6, f"gradient of {name} off by {error:.2e} (relative)"
