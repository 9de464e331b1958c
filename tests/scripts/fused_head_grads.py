"""Gradients of one fixed mini-batch with and without ``engine.fuse_loss_into_head``, through
`TrainEngine.forward_backward` on FSDP2: the RL loss (PPO, `graft.rl.job.rl_loss`, old log-probs
and advantages) and SFT's NLL under every built-in loss_agg_mode, log-probs in chunks of 8 tokens.

usage: [torchrun --nproc-per-node N] fused_head_grads.py OUT_DIR

Rank r takes samples r, r+N, ... in two micro-batches. Rank 0 saves, per loss, mode and setting,
the full (unsharded) gradient of every parameter and the reported loss to
OUT_DIR/<loss>-<mode>-<fused|unfused>.pt, and the number of head calls per loss and setting
to OUT_DIR/calls.pt.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from graft.config import compose
from graft.engine.batch.micro_batch import build_micro_batch
from graft.engine.distributed.env import end_torchrun_worker, init_distributed, shutdown_distributed
from graft.losses import BUILTIN_AGG_MODES
from graft.rl.job import rl_loss
from graft.testing.invariance import fixed_token_samples, rank_groups
from graft.training.sft import sft_loss
from graft.training.trainer import build_engine


def batches(env, extras: bool):
    samples = fixed_token_samples()
    generator = torch.Generator().manual_seed(3)
    per_sample = {"old_logprobs": [-torch.rand(len(s), generator=generator) * 4 for s in samples],
                  "advantages": [torch.randn(len(s), generator=generator) for s in samples]}
    groups = rank_groups(len(samples), rank=env.rank, world_size=env.world_size, micro_batches=2)
    return [build_micro_batch([samples[i] for i in group], packs_sequences=True, pad_token_id=0,
                              extras={k: [v[i] for i in group] for k, v in per_sample.items()}
                              if extras else None)
            for group in groups]


def main(out_dir: str) -> None:
    env = init_distributed(device_preference="cpu")
    cfg = compose(["model.preset=tiny-qwen3-moe", "engine.device=cpu",
                   "engine.logprob_chunk_tokens=8", "loss.clip_ratio_c=3.0"])
    engine = build_engine(cfg, env, pad_token_id=0)
    calls: dict[str, int] = {}
    head = engine.model.get_output_embeddings()
    for name, loss_fn in (("ppo", rl_loss(cfg=cfg)), ("sft", sft_loss)):
        for mode in BUILTIN_AGG_MODES:
            cfg.loss.loss_agg_mode = mode
            for fused in (False, True):
                cfg.engine.fuse_loss_into_head = fused
                key = f"{name}-{'fused' if fused else 'unfused'}"
                handle = head.register_forward_hook(
                    lambda *_, k=key: calls.__setitem__(k, calls.get(k, 0) + 1))
                pending = engine.forward_backward(batches(env, name == "ppo"), loss_fn,
                                                  loss_scale_factor=7.0)
                handle.remove()
                grads = {n: p.grad.full_tensor() for n, p in engine.model.named_parameters()}
                engine.optimizer.zero_grad(set_to_none=True)
                result = pending.result()
                if env.is_main:
                    torch.save({"grads": grads, "loss": result.loss, "metrics": result.metrics},
                               Path(out_dir) / f"{name}-{mode}-{'fused' if fused else 'unfused'}.pt")
    if env.is_main:
        torch.save(calls, Path(out_dir) / "calls.pt")


if __name__ == "__main__":
    main(sys.argv[1])
    shutdown_distributed()
    end_torchrun_worker()
