"""Losses, gradients and log-probs of one fixed mini-batch, for every built-in loss_agg_mode, with
rows split by sequence over ``SP`` ranks (graft-ulysses).

usage: [torchrun --nproc-per-node N] split_grads.py OUT_DIR SP [VARIANT,...]

``N / SP`` data-parallel ranks; data-parallel rank d takes samples d, d + N/SP, ... (the sp ranks
of one data-parallel rank share them), packed in rows of uneven lengths (several samples per
row, rows of at most 47 tokens). Variants (one engine each, built in this one process group):

* ``dense``: tiny-llama (GQA: 4 heads, 2 KV heads);
* ``moe``: tiny-qwen3-moe;
* ``dense_ckpt_chunked``: tiny-llama with activation checkpointing, eager attention, log-probs
  8 tokens at a time (engine.logprob_chunk_tokens) and pad_to_length (bucket 5: rows a
  multiple of 10 at sp=2);
* ``moe_r2``: tiny-qwen3-moe with routing replay R2 (routes recorded in the old-log-prob pass,
  replayed in the update).

Rank 0 writes OUT_DIR/<variant>.pt: per mode the reported loss and every parameter's full
gradient, the no-grad log-probs per sample (pad stripped), and for ``moe_r2`` the recorded
routes per sample.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from graft.config import compose
from graft.engine.distributed.env import end_torchrun_worker, init_distributed, shutdown_distributed
from graft.engine.phase import OLD_LOGPROBS, REF_LOGPROBS, SFT, UPDATE
from graft.losses import BUILTIN_AGG_MODES
from graft.plugins import get_plugin_manager
from graft.testing.invariance import fixed_token_samples
from graft.training.sft import sft_loss
from graft.training.trainer import build_engine
from graft_router_replay.routes import ROUTES

COMMON = ["engine.device=cpu", "engine.max_tokens_per_row=47"]
VARIANTS = {
    "dense": ["model.preset=tiny-llama", "trainer.mode=sft"],
    "moe": ["model.preset=tiny-qwen3-moe", "trainer.mode=sft"],
    "dense_ckpt_chunked": ["model.preset=tiny-llama", "trainer.mode=sft",
                           "engine.activation_checkpointing=true",
                           "model.attn_implementation=eager", "engine.logprob_chunk_tokens=8",
                           "engine.pad_to_length=true", "engine.pad_to_length_bucket=5"],
    "moe_r2": ["model.preset=tiny-qwen3-moe", "trainer.mode=rl",
               "features.router_replay.mode=R2"],
}


def run_variant(name: str, sp: int, env, out_dir: Path) -> None:
    torch.manual_seed(0)
    cfg = compose([*COMMON, *VARIANTS[name], f"features.ulysses.sp_size={sp}"])
    engine = build_engine(cfg, env, pad_token_id=0)
    samples = fixed_token_samples(12)
    local = samples[env.dp_rank::env.dp_size]
    batches = engine.micro_batches(local)
    result: dict = {"row_lengths": [b.layout.row_length for b in batches]}
    hook = get_plugin_manager().hook
    replay = name.endswith("_r2")
    if replay:
        hook.graft_step_begin(step=1)
        engine.logprobs(batches, phase=OLD_LOGPROBS)  # records the routes
        result[ROUTES] = [r for b in batches for r in b.layout.unpad(b.tensors[ROUTES])]
    phase = UPDATE if replay else SFT
    for mode in BUILTIN_AGG_MODES:
        cfg.loss.loss_agg_mode = mode
        pending = engine.forward_backward(batches, sft_loss, loss_scale_factor=7.0, phase=phase)
        grads = {n: p.grad.full_tensor() for n, p in engine.model.named_parameters()}
        engine.optimizer.zero_grad(set_to_none=True)
        result[mode] = {"loss": pending.result().loss, "grads": grads}
    if replay:
        metrics: dict[str, float] = {}
        hook.graft_step_end(step=1, metrics=metrics)
        result["replay_metrics"] = metrics
    logps = engine.logprobs(batches, phase=OLD_LOGPROBS if replay else REF_LOGPROBS)
    result["logprobs"] = [s for b, lp in zip(batches, logps, strict=True) for s in b.layout.unpad(lp)]
    # which samples this data-parallel rank holds, in order: to line them up with sp=1's
    result["samples"] = list(range(len(samples)))[env.dp_rank::env.dp_size]
    gathered = [None] * env.world_size if env.world_size > 1 else None
    if gathered is not None:
        torch.distributed.all_gather_object(gathered, {k: result[k] for k in
                                                       ("logprobs", "samples",
                                                        *((ROUTES,) if replay else ()))})
        result["per_rank"] = gathered
    if env.is_main:
        torch.save(result, out_dir / f"{name}.pt")


def main(out_dir: str, sp: int, names: list[str]) -> None:
    env = init_distributed(device_preference="cpu", sp_size=sp)
    for name in names:
        run_variant(name, sp, env, Path(out_dir))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",") if len(sys.argv) > 3 else VARIANTS)
    shutdown_distributed()
    end_torchrun_worker()
