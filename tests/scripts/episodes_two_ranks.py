"""RL with an environment whose episodes last 1 turn on rank 0 and 3 on rank 1: every rank runs
the busiest rank's turns (the embedded engine's decode steps are FSDP collectives; a rank that
stopped early would leave the other waiting forever).

usage: torchrun --nproc-per-node 2 episodes_two_ranks.py RUN_DIR [ENGINE]
(ENGINE: rollout.engine, default embedded; vllm gathers every rank's prompts on rank 0)
"""

from __future__ import annotations

import json
import os
import sys

import torch.distributed as dist

import graft
from graft import hookimpl
from graft.engine.distributed.env import end_torchrun_worker
from graft.testing import registered_plugin


class RankTurns:
    """Ends its episode after ``rank * 2 + 1`` turns, answering each turn with two ids."""

    def __init__(self) -> None:
        self.turns = 2 * dist.get_rank() + 1
        self.done = 0

    def reset(self, sample):
        return None

    def step(self, action_ids, action_text):
        self.done += 1
        return [40, 41], 1.0, self.done >= self.turns


class Plugin:
    @hookimpl
    def graft_environments(self):
        return {"rank-turns": RankTurns}


def main(run_dir: str, engine: str = "embedded") -> None:
    with registered_plugin(Plugin(), "rank-turns"):
        metrics = graft.train(overrides=[
            f"trainer.run_dir={run_dir}", "engine.device=cpu", "model.preset=tiny-llama",
            "trainer.total_steps=2", "rollout.prompts_per_step=4", "rollout.n=2",
            "rollout.max_new_tokens=3", "features.multiturn.environment=rank-turns",
            "features.multiturn.max_turns=4",
            "rollout.decode=dynamic", f"rollout.engine={engine}", "checkpoint.every_steps=0",
            "checkpoint.save_at_end=false",
            "export.hf_at_end=false", "trainer.print_sample_every_steps=0"])
    if os.environ.get("RANK", "0") == "0":
        print("METRICS " + json.dumps(metrics))


if __name__ == "__main__":
    main(*sys.argv[1:3])
    end_torchrun_worker()  # gloo's C++ teardown can abort a finished rank
