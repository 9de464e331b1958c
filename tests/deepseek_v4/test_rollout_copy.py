"""QAT reaches the rollout with ``rollout.decode=static``: the plain decode copy is quantised like
the policy (weights after every refresh, activations by the same hooks), so rollout samples the
quantised policy the trainer scores (before: the copy ran the bf16 masters, mismatch ~1e-2)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from graft.config import compose
from graft.models import build_model
from graft.rollout.inference_copy import InferenceCopy
from graft.training.trainer import Trainer
from graft_deepseek_v4.install import install_qat

TOKENS = torch.tensor([[1, 70, 83, 84, 93, 4, 69, 70, 71, 30, 21, 22, 15, 23, 33, 40, 41, 42]])


@pytest.mark.parametrize("experts", ["fp8", "fp4"])
def test_the_decode_copy_computes_the_quantised_policy_after_every_refresh(experts: str) -> None:
    cfg = compose(["model.preset=tiny-deepseek-v4", "engine.device=cpu",
                   "features.deepseek_v4.qat=fp8_blockwise",
                   f"features.deepseek_v4.expert_dtype={experts}"])
    policy, _ = build_model(cfg.model, seed=0)
    state = install_qat(policy, cfg, "policy")
    copy = InferenceCopy(policy, dtype=torch.float32, device=torch.device("cpu"), cfg=cfg)
    with torch.no_grad():
        before = policy(TOKENS).logits
        assert torch.equal(copy.model(TOKENS).logits, before)
        state.weights.restore()  # what the optimizer step pre-hook does; then AdamW moves them
        generator = torch.Generator().manual_seed(1)
        for param in policy.parameters():
            param.add_(1e-2 * torch.randn(param.shape, generator=generator))
        copy.refresh()  # after the update
        after = policy(TOKENS).logits
        assert not torch.equal(after, before)
        assert torch.equal(copy.model(TOKENS).logits, after)
    experts_module = copy.model.model.layers[1].mlp.experts
    assert torch.equal(experts_module.down_proj, policy.model.layers[1].mlp.experts.down_proj)


def mismatch(run_dir: Path, decode: str) -> float:
    cfg = compose([f"trainer.run_dir={run_dir}", "model.preset=tiny-deepseek-v4",
                   "engine.device=cpu", "features.deepseek_v4.qat=fp8_blockwise",
                   f"rollout.decode={decode}", "trainer.total_steps=1",
                   "rollout.prompts_per_step=2", "rollout.n=2", "rollout.max_new_tokens=4",
                   "algorithm.old_logprobs=always", "checkpoint.every_steps=0",
                   "checkpoint.save_at_end=false", "export.hf_at_end=false"])
    return Trainer(cfg).fit()[0]["train_infer_logprob_diff"]


@pytest.mark.slow  # two RL runs: ~30 s of CPU
def test_static_decode_samples_the_quantised_policy_like_dynamic_decode(tmp_path: Path) -> None:
    static, dynamic = mismatch(tmp_path / "static", "static"), mismatch(tmp_path / "dynamic",
                                                                       "dynamic")
    # the trained model itself generates: 1.2e-7 on one 2-core machine, 1.4e-5 on another (its
    # CPU's fp32 kernels round otherwise, and a code the fake quant flips moves a token's
    # log-prob); the unquantised copy gave 1.5e-2
    assert dynamic < 1e-4, dynamic
    assert static <= 2 * dynamic + 1e-6, (static, dynamic)  # unquantised copy: ~1.5e-2
