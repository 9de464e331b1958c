"""Build a run's model from a local Hugging Face directory (sharded over the ranks) and report
its full weights and this rank's peak resident memory.

    torchrun --nproc-per-node N load_pretrained.py HF_DIR OUT_DIR

Rank 0 saves the gathered weights (``weights.pt``); every rank writes ``rss_rank<r>.json``.
"""

from __future__ import annotations

import json
import resource
import sys
from pathlib import Path

import torch

from graft.config import compose
from graft.engine.distributed.env import end_torchrun_worker, init_distributed, shutdown_distributed
from graft.engine.distributed.parallelize import build_parallel_model
from graft.export.stream import hf_tensors


def main(hf_dir: str, out_dir: str) -> None:
    env = init_distributed(device_preference="cpu")
    cfg = compose([f"model.path={hf_dir}", "engine.device=cpu"])
    model, _ = build_parallel_model(env, cfg=cfg)
    rss_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    weights = {name: tensor.clone() for name, tensor in hf_tensors(model, dtype=None,
                                                                   is_main=env.is_main)}
    out = Path(out_dir)
    (out / f"rss_rank{env.rank}.json").write_text(json.dumps({"peak_rss_gib": rss_gib}))
    if env.is_main:
        torch.save(weights, out / "weights.pt")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    shutdown_distributed()
    end_torchrun_worker()
