"""SFT from a local Hugging Face directory (``model.path``) without and with the offload, on the
CPU stand-in for the device: the run real users make, on every rank of a torchrun job.

usage: torchrun --nproc-per-node N model_path_runs.py HF_DIR OUT_DIR [OVERRIDE ...]

Every rank runs both trainings in one process group and writes ``OUT_DIR/rank<r>.json``:
``{"plain": rows, "offload": rows}``, the per-step metrics each run returned on that rank (the
core's are reduced over the ranks; ``offload/*`` are the rank's own).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from graft.config import compose
from graft.engine.distributed.env import end_torchrun_worker, init_distributed, shutdown_distributed
from graft.training.trainer import Trainer
from graft_offload.runtime import use_copy_backend
from graft_offload.standin import DeferredCopyBackend

RUN = ["trainer.mode=sft", "trainer.total_steps=3", "engine.device=cpu",
       "engine.activation_checkpointing=true", "features.offload.min_tensor_mb=0",
       "checkpoint.every_steps=0", "checkpoint.save_at_end=false", "export.hf_at_end=false"]


def fit(overrides: list[str]) -> list[dict]:
    trainer = Trainer(compose(overrides))
    try:
        return trainer.fit()
    finally:
        del trainer  # FSDP2 state holds the process group until the model is gone


def main(hf_dir: str, out_dir: str, extra: list[str]) -> None:
    env = init_distributed(device_preference="cpu")
    out = Path(out_dir)
    base = [*RUN, f"model.path={hf_dir}", *extra]
    with use_copy_backend(DeferredCopyBackend):
        rows = {"plain": fit([*base, f"trainer.run_dir={out / 'plain'}"]),
                "offload": fit([*base, f"trainer.run_dir={out / 'offload'}",
                                "features.offload.enabled=true"])}
    (out / f"rank{env.rank}.json").write_text(json.dumps(rows))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
    shutdown_distributed()
    end_torchrun_worker()
