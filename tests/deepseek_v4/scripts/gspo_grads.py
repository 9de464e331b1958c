"""Gradients of one fixed RL mini-batch under GSPO and every built-in loss_agg_mode.

usage: [torchrun --nproc-per-node N] gspo_grads.py OUT_DIR MICRO_BATCHES_PER_RANK

Rank r takes samples r, r+N, ...; they are split into MICRO_BATCHES_PER_RANK micro-batches.
Old log-probs are the model's own plus a fixed per-sample perturbation (so sequence ratios
straddle the clip range), rollout log-probs another; sequence-level rollout importance weights
are on. Rank 0 saves the full gradient of every parameter to OUT_DIR/<mode>.pt.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from graft.config import compose
from graft.engine.distributed import end_torchrun_worker, init_distributed, shutdown_distributed
from graft.engine.micro_batch import TokenSample, build_micro_batch
from graft.engine.phase import OLD_LOGPROBS
from graft.losses.modes import BUILTIN_AGG_MODES
from graft.rl.job import rl_loss
from graft.training.trainer import build_engine


def fixed_samples() -> list[tuple[TokenSample, float]]:
    generator = torch.Generator().manual_seed(7)
    samples = []
    for index in range(16):
        length = int(torch.randint(6, 40, (1,), generator=generator))
        ids = torch.randint(3, 100, (length,), generator=generator).tolist()
        # sample 5 has no response token at all: it must not count as a sequence
        start = length if index == 5 else int(torch.randint(1, length - 1, (1,), generator=generator))
        advantage = float(torch.randn((), generator=generator))
        samples.append((TokenSample(ids, response_start=start), advantage))
    return samples


def perturbation(index: int, length: int, scale: float) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 + index)
    return scale * (torch.randn(length, generator=generator) + torch.randn((), generator=generator))


def main(out_dir: str, micro_batches: int) -> None:
    env = init_distributed(device_preference="cpu")
    cfg = compose(["model.preset=tiny-qwen3-moe", "engine.device=cpu", "trainer.mode=sft",
                   "loss.policy_loss=gspo", "loss.clip_ratio_low=0.01",
                   "loss.clip_ratio_high=0.015", "features.deepseek_v4.gspo_rollout_is=sequence"])
    engine = build_engine(cfg, env, pad_token_id=0)
    indices = list(range(16))[env.rank::env.world_size]
    everything = fixed_samples()
    groups = [indices[i::micro_batches] for i in range(micro_batches)]
    batches = []
    for group in groups:
        samples = [everything[i][0] for i in group]
        extras = {"advantages": [torch.full((len(everything[i][0]),), everything[i][1])
                                 for i in group],
                  "rollout_logprobs": [perturbation(100 + i, len(everything[i][0]), 0.05)
                                       for i in group]}
        batches.append(build_micro_batch(samples, packs_sequences=True, pad_token_id=0,
                                         extras=extras))
    for batch, logp, group in zip(batches, engine.logprobs(batches, phase=OLD_LOGPROBS), groups,
                                  strict=True):
        noise = batch.layout.pack([perturbation(i, len(everything[i][0]), 0.02) for i in group])
        batch.tensors["old_logprobs"] = logp + noise
        batch.tensors["rollout_logprobs"] = batch.tensors["old_logprobs"] + batch.tensors[
            "rollout_logprobs"]
    loss_fn = rl_loss(cfg)
    for mode in BUILTIN_AGG_MODES:
        cfg.loss.loss_agg_mode = mode
        engine.forward_backward(batches, loss_fn, loss_scale_factor=7.0)
        grads = {name: p.grad.full_tensor() for name, p in engine.model.named_parameters()}
        engine.optimizer.zero_grad(set_to_none=True)
        if env.is_main:
            torch.save(grads, Path(out_dir) / f"{mode}.pt")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
    shutdown_distributed()
    end_torchrun_worker()
