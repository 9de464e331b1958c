"""RL with ``features.exact.enabled=true`` over 2 ranks for 10 steps (the tiny MoE preset unless an
OVERRIDE names another), rows of at most 32 tokens: rank 0 prints the metrics
(``train_infer_logprob_diff`` and ``train_infer_logprob_exact_fraction`` are reduced over both
ranks).

usage: torchrun --nproc-per-node 2 two_ranks.py RUN_DIR [DECODE [OVERRIDE ...]]
(DECODE: rollout.decode, default static; OVERRIDEs: more settings, such as another preset)
"""

from __future__ import annotations

import json
import os
import sys

import graft
from graft.engine.distributed.env import end_torchrun_worker


def main(run_dir: str, decode: str = "static", *overrides: str) -> None:
    metrics = graft.train(overrides=[
        f"trainer.run_dir={run_dir}", "engine.device=cpu", "model.preset=tiny-qwen3-moe",
        "features.exact.enabled=true", f"rollout.decode={decode}", "trainer.total_steps=10",
        "rollout.prompts_per_step=4", "rollout.n=3", "rollout.max_new_tokens=6",
        "engine.max_tokens_per_row=32", "checkpoint.every_steps=0",
        "checkpoint.save_at_end=false", "export.hf_at_end=false",
        "trainer.print_sample_every_steps=0", *overrides])
    if os.environ.get("RANK", "0") == "0":
        print("METRICS " + json.dumps(metrics))


if __name__ == "__main__":
    main(*sys.argv[1:])
    end_torchrun_worker()  # gloo's C++ teardown can abort a finished rank
