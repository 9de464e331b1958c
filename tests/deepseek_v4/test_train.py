"""End to end on CPU: QAT + GSPO RL on the tiny DeepSeek-V4 (1 and 2 ranks), and a QAT run's
checkpoint resumes bit for bit (its indexer has no optimizer state: the core backfills it)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from graft.config import compose
from graft.training.trainer import Trainer

ACCEPTANCE = ["model.preset=tiny-deepseek-v4", "features.deepseek_v4.qat=fp8_blockwise",
              "loss.policy_loss=gspo", "loss.clip_ratio_low=3e-4", "loss.clip_ratio_high=4e-4",
              "loss.clip_ratio_c=null"]
SMALL_RL = ["trainer.total_steps=2", "rollout.prompts_per_step=2", "rollout.n=4",
            "rollout.max_new_tokens=4", "checkpoint.save_at_end=false", "export.hf_at_end=false"]
PASSES = "deepseek_v4/qat_weight_passes"


@pytest.mark.slow
def test_qat_gspo_rl_on_one_rank_with_a_quantised_reference(graft_train, metrics_of,
                                                            tmp_path: Path) -> None:
    graft_train(tmp_path, *ACCEPTANCE, *SMALL_RL, "loss.kl_coef=0.1")
    rows = metrics_of(tmp_path)
    assert [row[PASSES] for row in rows] == [1.0, 1.0], "one weight quantisation per step"
    assert rows[0]["kl"] == 0.0, "the reference is quantised like the policy"
    for key in ("clip_fraction_lower", "clip_fraction_upper", "seq_ratio", "loss"):
        assert all(torch.isfinite(torch.tensor(row[key])) for row in rows), key


@pytest.mark.slow
def test_qat_gspo_rl_on_two_ranks(graft_train, metrics_of, tmp_path: Path) -> None:
    graft_train(tmp_path, *ACCEPTANCE, *SMALL_RL, "algorithm.mini_batches=2",
                "engine.max_tokens_per_micro_batch=32", nproc=2)
    rows = metrics_of(tmp_path)
    assert [row[PASSES] for row in rows] == [2.0, 2.0], "one per optimizer step"
    assert all(torch.isfinite(torch.tensor(row["loss"])) for row in rows)


def sft_trainer(run_dir: Path, steps: int, *overrides: str) -> Trainer:
    return Trainer(compose([f"trainer.run_dir={run_dir}", f"trainer.total_steps={steps}",
                            "model.preset=tiny-deepseek-v4", "engine.device=cpu",
                            "trainer.mode=sft", "trainer.global_batch_size=4",
                            "checkpoint.every_steps=2", "export.hf_at_end=false",
                            "features.deepseek_v4.qat=fp8_blockwise", *overrides]))


def parameters(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {name: p.full_tensor().clone() for name, p in trainer.engine.model.named_parameters()}


@pytest.mark.slow
def test_a_qat_checkpoint_resumes_bit_for_bit(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="graft.checkpoint")
    sft_trainer(tmp_path / "resumed", 2).fit()
    resumed = sft_trainer(tmp_path / "resumed", 3)
    assert resumed.step == 2
    resumed.fit()
    straight = sft_trainer(tmp_path / "straight", 3)
    straight.fit()
    ours, theirs = parameters(resumed), parameters(straight)
    for name, value in theirs.items():
        assert torch.equal(ours[name], value), name
    assert "parameters had no optimizer state" in caplog.text
    assert "self_attn.compressor.indexer" in caplog.text, "the indexer gets no gradient"
