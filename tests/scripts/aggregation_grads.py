"""Gradients of one fixed mini-batch under every built-in loss_agg_mode (the SFT loss).

usage: [torchrun --nproc-per-node N] aggregation_grads.py OUT_DIR MICRO_BATCHES_PER_RANK

Rank r takes samples r, r+N, ...; they are split into MICRO_BATCHES_PER_RANK micro-batches.
Rank 0 saves the full (unsharded) gradient of every parameter to OUT_DIR/<mode>.pt.
"""

from __future__ import annotations

import sys

from graft.config import compose
from graft.engine.batch.micro_batch import build_micro_batch
from graft.engine.distributed.env import end_torchrun_worker, init_distributed, shutdown_distributed
from graft.testing.invariance import fixed_token_samples, rank_groups, save_gradients_per_mode
from graft.training.sft import sft_loss
from graft.training.trainer import build_engine


def main(out_dir: str, micro_batches: int) -> None:
    env = init_distributed(device_preference="cpu")
    cfg = compose(["model.preset=tiny-qwen3-moe", "engine.device=cpu", "trainer.mode=sft"])
    engine = build_engine(cfg, env, pad_token_id=0)
    samples = fixed_token_samples()
    groups = rank_groups(len(samples), rank=env.rank, world_size=env.world_size,
                         micro_batches=micro_batches)
    batches = [build_micro_batch([samples[i] for i in group], packs_sequences=True, pad_token_id=0)
               for group in groups]
    save_gradients_per_mode(engine, batches, sft_loss, cfg, out_dir, is_main=env.is_main)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
    shutdown_distributed()
    end_torchrun_worker()
