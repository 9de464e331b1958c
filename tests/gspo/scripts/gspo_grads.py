"""Gradients of one fixed RL mini-batch under GSPO and every built-in loss_agg_mode.

usage: [torchrun --nproc-per-node N] gspo_grads.py OUT_DIR MICRO_BATCHES_PER_RANK

Rank r takes samples r, r+N, ...; they are split into MICRO_BATCHES_PER_RANK micro-batches.
Old log-probs are the model's own plus a fixed per-sample perturbation (so sequence ratios
straddle the clip range), rollout log-probs another; sequence-level rollout importance weights
are on. Rank 0 saves the full gradient of every parameter to OUT_DIR/<mode>.pt.
"""

from __future__ import annotations

import sys

import torch

from graft.config import compose
from graft.engine.batch.micro_batch import build_micro_batch
from graft.engine.distributed.env import end_torchrun_worker, init_distributed, shutdown_distributed
from graft.engine.phase import OLD_LOGPROBS
from graft.rl.job import rl_loss
from graft.testing.invariance import fixed_token_samples, rank_groups, save_gradients_per_mode
from graft.training.trainer import build_engine


def perturbation(index: int, length: int, scale: float) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 + index)
    return scale * (torch.randn(length, generator=generator) + torch.randn((), generator=generator))


def main(out_dir: str, micro_batches: int) -> None:
    env = init_distributed(device_preference="cpu")
    cfg = compose(["model.preset=tiny-qwen3-moe", "engine.device=cpu", "trainer.mode=sft",
                   "loss.policy_loss=gspo", "loss.clip_ratio_low=0.01",
                   "loss.clip_ratio_high=0.015", "loss.clip_ratio_c=null",
                   "features.gspo.rollout_is=sequence"])
    engine = build_engine(cfg, env, pad_token_id=0)
    samples = fixed_token_samples()
    advantages = torch.randn(len(samples), generator=torch.Generator().manual_seed(8)).tolist()
    groups = rank_groups(len(samples), rank=env.rank, world_size=env.world_size,
                         micro_batches=micro_batches)
    batches = []
    for group in groups:
        extras = {"advantages": [torch.full((len(samples[i]),), advantages[i]) for i in group],
                  "rollout_logprobs": [perturbation(100 + i, len(samples[i]), 0.05)
                                       for i in group]}
        batches.append(build_micro_batch([samples[i] for i in group], packs_sequences=True,
                                         pad_token_id=0, extras=extras))
    for batch, logp, group in zip(batches, engine.logprobs(batches, phase=OLD_LOGPROBS), groups,
                                  strict=True):
        noise = batch.layout.pack([perturbation(i, len(samples[i]), 0.02) for i in group])
        batch.tensors["old_logprobs"] = logp + noise
        batch.tensors["rollout_logprobs"] = batch.tensors["old_logprobs"] + batch.tensors[
            "rollout_logprobs"]
    save_gradients_per_mode(engine, batches, rl_loss(cfg=cfg), cfg, out_dir, is_main=env.is_main)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
    shutdown_distributed()
    end_torchrun_worker()
