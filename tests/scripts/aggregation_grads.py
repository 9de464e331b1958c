"""Gradients of one fixed mini-batch under every built-in loss_agg_mode.

usage: [torchrun --nproc-per-node N] aggregation_grads.py OUT_DIR MICRO_BATCHES_PER_RANK

Rank r takes samples r, r+N, ...; they are split into MICRO_BATCHES_PER_RANK micro-batches.
Rank 0 saves the full (unsharded) gradient of every parameter to OUT_DIR/<mode>.pt.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from graft.config import compose
from graft.engine.distributed import end_torchrun_worker, init_distributed, shutdown_distributed
from graft.engine.micro_batch import TokenSample, build_micro_batch
from graft.losses.modes import BUILTIN_AGG_MODES
from graft.training.sft import sft_loss
from graft.training.trainer import build_engine


def fixed_samples() -> list[TokenSample]:
    generator = torch.Generator().manual_seed(7)
    samples = []
    for index in range(16):
        length = int(torch.randint(6, 40, (1,), generator=generator))
        ids = torch.randint(3, 100, (length,), generator=generator).tolist()
        # sample 5 has no response token at all: it must not count as a sequence
        start = length if index == 5 else int(torch.randint(1, length - 1, (1,), generator=generator))
        samples.append(TokenSample(ids, response_start=start))
    return samples


def main(out_dir: str, micro_batches: int) -> None:
    env = init_distributed(device_preference="cpu")
    cfg = compose(["model.preset=tiny-qwen3-moe", "engine.device=cpu", "trainer.mode=sft"])
    engine = build_engine(cfg, env, pad_token_id=0)
    local = fixed_samples()[env.rank::env.world_size]
    groups = [local[i::micro_batches] for i in range(micro_batches)]
    batches = [build_micro_batch(g, packs_sequences=True, pad_token_id=0) for g in groups]
    for mode in BUILTIN_AGG_MODES:
        cfg.loss.loss_agg_mode = mode
        engine.forward_backward(batches, sft_loss, loss_scale_factor=7.0)
        grads = {name: p.grad.full_tensor() for name, p in engine.model.named_parameters()}
        engine.optimizer.zero_grad(set_to_none=True)
        if env.is_main:
            torch.save(grads, Path(out_dir) / f"{mode}.pt")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
    shutdown_distributed()
    end_torchrun_worker()
