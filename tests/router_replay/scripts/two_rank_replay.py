"""R2 on a 512-expert tiny Qwen3-MoE: record, move the weights, replay; on 1 or 2 gloo ranks.

usage: [torchrun --nproc-per-node 2] two_rank_replay.py OUT_DIR

The same two micro-batches either way: one rank runs both, two ranks one each. The old-log-prob
pass records, one SFT step moves the routers, the update pass replays. Rank 0 writes
``OUT_DIR/result.pt``: the full gradients of the replayed update and the step's metrics; every
rank writes ``OUT_DIR/routes<rank>.pt``, the routes it recorded for its micro-batches.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from graft.config import compose
from graft.engine.batch.micro_batch import TokenSample, build_micro_batch
from graft.engine.distributed.env import end_torchrun_worker, init_distributed, shutdown_distributed
from graft.plugins import get_plugin_manager
from graft.training.sft import sft_loss
from graft.training.trainer import build_engine
from graft_router_replay import ROUTES


def micro_batch_samples() -> list[list[TokenSample]]:
    generator = torch.Generator().manual_seed(3)
    samples = [TokenSample([1, *torch.randint(3, 100, (int(n),), generator=generator).tolist()], 4)
               for n in torch.randint(8, 30, (8,), generator=generator)]
    return [samples[0::2], samples[1::2]]


def main(out_dir: str) -> None:
    env = init_distributed(device_preference="cpu")
    cfg = compose(["model.preset=tiny-qwen3-moe", "+model.overrides.num_local_experts=512",
                   "engine.device=cpu", "features.router_replay.mode=R2", "optim.lr=0.01"])
    engine = build_engine(cfg, env, pad_token_id=0)  # graft_pre_shard hooks the routers
    hook = get_plugin_manager().hook
    hook.graft_step_begin(step=1)
    groups = micro_batch_samples()[env.rank::env.world_size]
    batches = [build_micro_batch(g, packs_sequences=True, pad_token_id=0) for g in groups]
    engine.logprobs(batches, phase="old_logprobs")  # records
    engine.forward_backward(batches, sft_loss, loss_scale_factor=1.0, phase="sft")
    engine.optimizer_step()  # the routers move
    engine.forward_backward(batches, sft_loss, loss_scale_factor=1.0, phase="update")  # replays
    grads = {name: p.grad.full_tensor() for name, p in engine.model.named_parameters()}
    metrics: dict[str, float] = {}
    hook.graft_step_end(step=1, metrics=metrics)

    local = [b.tensors[ROUTES].reshape(-1, *b.tensors[ROUTES].shape[2:]) for b in batches]
    torch.save(local, Path(out_dir) / f"routes{env.rank}.pt")
    if env.is_main:
        torch.save({"grads": grads, "metrics": metrics}, Path(out_dir) / "result.pt")
    del engine
    shutdown_distributed()
    end_torchrun_worker()


if __name__ == "__main__":
    main(sys.argv[1])
