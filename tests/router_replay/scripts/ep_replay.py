"""R2 on tiny GPT-OSS with its experts split over 2 ranks (``engine.ep_size=2``): record, move
the routers, replay.

usage: torchrun --nproc-per-node 2 ep_replay.py OUT_DIR

Each rank trains on its own micro-batch; its routers route its own tokens, whose experts the
all-to-all dispatch then sends to the rank holding them. The old-log-prob pass records, one SFT
step moves the routers, a reference-phase pass shows their native routing now, and the update
pass replays. Every rank writes ``OUT_DIR/rank<r>.pt``: the ids the routers gave the experts in
each pass (after the plugin's hook), the stored routes, the real-token mask and the metrics.
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
from graft_router_replay.routes import ROUTES, real_tokens


class Observer:
    """The ids every router handed on in the last forward (hooked after the plugin's replay)."""

    def __init__(self, routers: list[torch.nn.Module]) -> None:
        self.ids: dict[int, torch.Tensor] = {}
        self.handles = [r.register_forward_hook(self._keeper(i)) for i, r in enumerate(routers)]

    def _keeper(self, index: int):
        def keep(module, args, output) -> None:
            self.ids[index] = output[2].detach().clone()

        return keep

    def take(self) -> torch.Tensor:
        """``(tokens, layers, k)`` ids of the last forward."""
        ids = torch.stack([self.ids[i] for i in range(len(self.ids))], dim=1)
        self.ids = {}
        return ids


def samples_of(rank: int) -> list[TokenSample]:
    """Four samples of 8-29 tokens, different on every rank."""
    generator = torch.Generator().manual_seed(11 + rank)
    return [TokenSample([1, *torch.randint(3, 100, (int(n),), generator=generator).tolist()], 4)
            for n in torch.randint(8, 30, (4,), generator=generator)]


def main(out_dir: str) -> None:
    env = init_distributed(device_preference="cpu", ep_size=2)
    cfg = compose(["model.preset=tiny-gpt-oss", "engine.device=cpu", "engine.ep_size=2",
                   "features.router_replay.mode=R2", "optim.lr=0.02"])
    engine = build_engine(cfg, env, pad_token_id=0)  # graft_pre_shard hooks the routers
    observer = Observer(list(engine.family.router_modules(engine.model)))
    hook = get_plugin_manager().hook
    hook.graft_step_begin(step=1)
    batches = [build_micro_batch(samples_of(env.rank), packs_sequences=True, pad_token_id=0)]
    engine.logprobs(batches, phase="old_logprobs")  # records
    recorded = observer.take()
    engine.forward_backward(batches, sft_loss, loss_scale_factor=1.0, phase="sft")
    engine.optimizer_step()  # the routers move
    observer.take()
    engine.logprobs(batches, phase="ref_logprobs")  # a pass that never replays: native routing
    native = observer.take()
    engine.forward_backward(batches, sft_loss, loss_scale_factor=1.0, phase="update")  # replays
    replayed = observer.take()
    metrics: dict[str, float] = {}
    hook.graft_step_end(step=1, metrics=metrics)
    stored = batches[0].tensors[ROUTES]
    torch.save({"recorded": recorded, "native": native, "replayed": replayed,
                "stored": stored.reshape(-1, *stored.shape[2:]),
                "real": real_tokens(batches[0].layout).reshape(-1), "metrics": metrics},
               Path(out_dir) / f"rank{env.rank}.pt")
    del engine
    shutdown_distributed()
    end_torchrun_worker()


if __name__ == "__main__":
    main(sys.argv[1])
