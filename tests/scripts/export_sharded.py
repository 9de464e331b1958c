"""Export a tiny fp32 Llama sharded by FSDP2 over the ranks (as fp32 or bf16) and save what
rank 0's sink received, next to the same export of the unsharded model.

    torchrun --nproc-per-node 2 export_sharded.py OUT_DIR VOCAB_SIZE EXPORT_DTYPE

An even vocabulary splits every parameter in equal row blocks (the copy plan, all-gathers straight
into the bucket); an odd one makes the embedding and head uneven (the per-parameter path).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from graft.config import compose
from graft.engine.distributed.env import end_torchrun_worker, init_distributed, shutdown_distributed
from graft.engine.distributed.parallelize import parallelize
from graft.export.sinks.base import StateDictSink
from graft.export.stream import WeightExporter, hf_tensors
from graft.models.build import build_model

BUCKET_BYTES = 64 << 10  # several buckets for the tiny model


def main(out_dir: str, vocab_size: int, dtype_name: str) -> None:
    dtype = getattr(torch, dtype_name)
    env = init_distributed(device_preference="cpu")
    cfg = compose(["model.preset=tiny-llama", "engine.device=cpu",
                   f"+model.overrides.vocab_size={vocab_size}"])
    model, family = build_model(cfg.model)
    reference = {name: tensor.clone() for name, tensor in hf_tensors(model, dtype=dtype)}
    model = parallelize(model, family, cfg=cfg, mesh=env.mesh, device=env.device)
    exporter = WeightExporter(model, bucket_bytes=BUCKET_BYTES, dtype=dtype, is_main=env.is_main)
    sink = StateDictSink() if env.is_main else None
    stats = [exporter.export(sink) for _ in range(2)]  # the second one reuses the plan
    planned = exporter.copy_plan is not None
    if env.is_main:
        torch.save({"weights": sink.weights, "reference": reference, "planned": planned,
                    "buckets": [s.buckets for s in stats]}, Path(out_dir) / "export.pt")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
    shutdown_distributed()
    end_torchrun_worker()
