"""``engine.fuse_loss_into_head``: the chunked head takes a token-separable loss's gradient in its
forward (`graft.engine.head.fused_loss`, `graft.engine.head.token_loss`): the same log-probs bit for
bit, the same loss and gradients as the chunked head's backward (fp32, CPU, 1e-6; bit-identical
on the default run), every preset family and every built-in ``loss_agg_mode``, and the head
runs once per chunk instead of twice. Losses it cannot serve take the chunked head's backward."""

from __future__ import annotations

import tempfile
from types import SimpleNamespace

import pytest
import torch

import graft
from graft.config import ModelConfig, compose
from graft.engine.batch.micro_batch import TokenSample, build_micro_batch
from graft.engine.distributed.env import init_distributed
from graft.engine.distributed.parallelize import parallelize
from graft.engine.forward import forward_fused_loss, forward_logprobs
from graft.engine.head.token_loss import chunk_token_loss, fuses_loss, token_weights
from graft.hookspecs import hookimpl
from graft.losses import BUILTIN_AGG_MODES, is_token_separable, token_separable
from graft.losses.aggregation import AggregationContext
from graft.losses.policy import ppo_clip_loss
from graft.losses.registry import aggregate_loss, builtin_aggregation
from graft.models import build_model
from graft.models.registry import model_families
from graft.plugins import GraftPluginManager
from graft.training.sft import sft_loss

PRESETS = sorted(name for family in model_families().values() for name in family.presets)

LENGTHS = (37, 11, 52, 3)
PPO = SimpleNamespace(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0)
CTX = AggregationContext(global_tokens=150.0, global_sequences=5.0, dp_size=2,
                         loss_scale_factor=64.0)


@token_separable
def ppo(logp, tensors, mask):
    """PPO's loss on a batch with old log-probs and advantages (as graft.rl.job's loss_fn)."""
    return ppo_clip_loss(logp=logp, old_logp=tensors["old_logprobs"],
                         advantages=tensors["advantages"], mask=mask, cfg=PPO)


def build(preset: str, **overrides):
    model, family = build_model(ModelConfig(preset=preset, overrides=overrides), seed=3)
    return model.float().train(), family


def grads_of(model, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_grads_close(actual: dict, expected: dict, what: str) -> None:
    """Every gradient within 1e-6 of the expected one, relative to its norm."""
    assert actual.keys() == expected.keys(), what
    for name, grad in actual.items():
        error = float((grad - expected[name]).norm() / expected[name].norm().clamp_min(1e-30))
        assert error <= 1e-6, f"{what}: gradient of {name} off by {error:.2e} (relative)"


def micro_batch(family, vocab: int):
    """Four samples (one with a single response token), PPO's old log-probs and advantages."""
    generator = torch.Generator().manual_seed(0)
    samples = [TokenSample([1, *torch.randint(3, vocab, (n,), generator=generator).tolist()],
                           max(1, n // 3)) for n in LENGTHS]
    extras = {"old_logprobs": [-torch.rand(n + 1, generator=generator) * 6 for n in LENGTHS],
              "advantages": [torch.randn(n + 1, generator=generator) for n in LENGTHS]}
    return build_micro_batch(samples, packs_sequences=family.packs_sequences, pad_token_id=0,
                             temperatures=[0.7, 1.0, 1.3, 0.9], extras=extras)


def unfused(model, family, batch, loss_fn, mode: str, chunk: int):
    """The chunked head's path, as `TrainEngine.forward_backward` runs it without the fusion."""
    logp, _ = forward_logprobs(model, family, batch, compute_dtype=torch.float32,
                               chunk_tokens=chunk)
    mask = batch.to_sequences(batch.tensors["loss_mask"])
    tensors = {k: batch.to_sequences(v) for k, v in batch.tensors.items()}
    loss_mat, _ = loss_fn(batch.to_sequences(logp), tensors, mask)
    loss = aggregate_loss(loss_mat, mask, mode, CTX)
    return logp.detach(), loss.detach(), grads_of(model, loss + 0.0 * logp.sum())


def fused(model, family, batch, loss_fn, mode: str, chunk: int):
    token_loss = chunk_token_loss(loss_fn, batch, token_weights(batch, mode, CTX))
    logp, _, total = forward_fused_loss(model, family, batch, token_loss,
                                        compute_dtype=torch.float32, chunk_tokens=chunk)
    assert not logp.requires_grad
    return logp, total.detach(), grads_of(model, total)


@pytest.mark.parametrize("preset, overrides", [*[(p, {}) for p in PRESETS],
                                               ("tiny-llama", {"tie_word_embeddings": True})])
def test_the_fused_head_gives_the_chunked_heads_loss_and_gradients(preset: str,
                                                                   overrides: dict) -> None:
    model, family = build(preset, **overrides)
    batch = micro_batch(family, model.config.vocab_size)
    for mode, chunk in [("token-mean", 16), ("seq-mean-token-mean", 33), ("token-sum", 4096)]:
        logp, loss, grads = unfused(model, family, batch, ppo, mode, chunk)
        logp_f, loss_f, grads_f = fused(model, family, batch, ppo, mode, chunk)
        assert torch.equal(logp_f, logp), (preset, mode)
        torch.testing.assert_close(loss_f, loss.float(), rtol=1e-6, atol=1e-7)
        assert_grads_close(grads_f, grads, f"{preset}, {mode}, chunk {chunk}")


@pytest.mark.parametrize("mode", BUILTIN_AGG_MODES)
def test_every_builtin_mode_and_sfts_loss(mode: str) -> None:
    model, family = build("tiny-qwen3-moe")
    batch = micro_batch(family, model.config.vocab_size)
    for loss_fn in (ppo, sft_loss):
        _, loss, grads = unfused(model, family, batch, loss_fn, mode, 16)
        _, loss_f, grads_f = fused(model, family, batch, loss_fn, mode, 16)
        torch.testing.assert_close(loss_f, loss.float(), rtol=1e-6, atol=1e-7)
        assert_grads_close(grads_f, grads, f"{mode}, {loss_fn.__name__}")


def test_the_long_context_settings_on_fsdp2() -> None:
    """With the core's settings that reach long sequences (activation checkpointing, two blocks
    a checkpoint) on FSDP2, the fused head's gradients are the chunked head's (with
    graft-activation-memory's tiled MLP and recomputed norms too:
    tests/activation_memory/test_plugin.py). A fresh model for each path: the helpers zero the
    gradients after the forward, when FSDP2's root holds its unsharded parameters, so a second
    path on the same model would add to the first one's sharded gradients."""
    env = init_distributed(device_preference="cpu")
    cfg = compose(["model.preset=tiny-llama", "engine.device=cpu",
                   "engine.activation_checkpointing=true", "engine.checkpoint_every_blocks=2"])
    runs = []
    for path in (unfused, fused):
        model, family = build_model(cfg.model, seed=0)
        model = parallelize(model.float(), family, cfg=cfg, mesh=env.mesh, device=env.device)
        batch = micro_batch(family, model.config.vocab_size)
        _, loss, grads = path(model.train(), family, batch, ppo, "token-mean", 16)
        runs.append((loss, {n: g.full_tensor() for n, g in grads.items()}))
    (loss, grads), (loss_f, grads_f) = runs
    torch.testing.assert_close(loss_f, loss.float(), rtol=1e-6, atol=1e-7)
    assert_grads_close(grads_f, grads, "long-context settings")


def test_the_head_runs_once_per_chunk() -> None:
    """The point of the fusion: no chunk's logits are computed twice (the chunked head's
    backward recomputes each one)."""
    model, family = build("tiny-llama")
    batch = micro_batch(family, model.config.vocab_size)
    calls = []
    model.get_output_embeddings().register_forward_hook(lambda *_: calls.append(1))
    chunks = -(-batch.tensors["labels"].numel() // 16)
    unfused(model, family, batch, ppo, "token-mean", 16)
    assert len(calls) == 2 * chunks + 1  # the model's own call sees zero positions
    calls.clear()
    fused(model, family, batch, ppo, "token-mean", 16)
    assert len(calls) == chunks + 1


def test_the_gradient_scales_with_the_incoming_one() -> None:
    model, family = build("tiny-llama")
    batch = micro_batch(family, model.config.vocab_size)
    token_loss = chunk_token_loss(ppo, batch, token_weights(batch, "token-mean", CTX))
    runs = []
    for scale in (1.0, 0.5):
        _, _, total = forward_fused_loss(model, family, batch, token_loss,
                                         compute_dtype=torch.float32, chunk_tokens=16)
        runs.append(grads_of(model, total * scale))
    for name, grad in runs[0].items():
        torch.testing.assert_close(runs[1][name], grad * 0.5)


class TakesTokenMean:
    """A plugin that redefines a built-in mode (plugins are asked first)."""

    @hookimpl
    def graft_loss_aggregate(self, loss_mat, loss_mask, mode):
        return (loss_mat * loss_mask).max() if mode == "token-mean" else None


def test_only_token_separable_losses_and_the_cores_modes_fuse() -> None:
    assert is_token_separable(ppo_clip_loss) and is_token_separable(sft_loss)
    assert not is_token_separable(lambda **kw: kw)  # unmarked (graft-gspo's GSPO: tests/gspo)
    assert fuses_loss(sft_loss, "token-mean", enabled=True, chunk_tokens=16)
    assert not fuses_loss(sft_loss, "token-mean", enabled=False, chunk_tokens=16)
    assert not fuses_loss(sft_loss, "token-mean", enabled=True, chunk_tokens=0)
    assert not fuses_loss(lambda *a: a, "token-mean", enabled=True, chunk_tokens=16)
    manager = GraftPluginManager()
    manager.load(allowlist=[])
    assert builtin_aggregation("token-mean", manager)
    assert not builtin_aggregation("demo-max", manager)
    manager.register(TakesTokenMean(), "takes-token-mean")
    assert not builtin_aggregation("token-mean", manager)
    assert builtin_aggregation("token-sum", manager)


def run_default(fuse: bool, steps: int = 3) -> list[tuple[float, ...]]:
    with tempfile.TemporaryDirectory() as run_dir:
        rows = graft.train(overrides=[
            f"trainer.run_dir={run_dir}", f"trainer.total_steps={steps}",
            f"engine.fuse_loss_into_head={str(fuse).lower()}", "checkpoint.every_steps=0",
            "checkpoint.save_at_end=false", "export.hf_at_end=false",
            "trainer.print_sample_every_steps=0"])
    return [(r["loss"], r["grad_norm"], r["entropy"], r["reward_mean"]) for r in rows]


def test_the_default_run_is_bit_identical_with_and_without_the_fusion() -> None:
    assert run_default(True) == run_default(False)
