"""Worker for test_delta.py: graft-vllm's delta export of expert-parallel fused tensors. The model
and handler are the core's `tests/core/export/expert_rows_worker.py` (a tiny Qwen3-MoE whose
experts are split over ``ep``, exported fused): a delta export, a sparse update (one expert of the
last ep rank's block), a second delta export, and a full export to compare it with. Run under
``torchrun --nproc-per-node N delta_expert_rows.py OUT_DIR EP``; rank 0 saves
``OUT_DIR/result.pt``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import torch

from graft.engine.distributed.env import end_torchrun_worker, shutdown_distributed
from graft.export import WeightExporter
from graft.export.gather import local_tensor
from graft.plugins import get_plugin_manager
from graft_vllm.delta import DeltaTracker, StateDictDeltaSink

CORE_WORKER = Path(__file__).resolve().parents[2] / "core" / "export" / "expert_rows_worker.py"


def core_worker() -> ModuleType:
    """The core's expert-rows worker as a module (its model and handler)."""
    spec = importlib.util.spec_from_file_location("expert_rows_worker", CORE_WORKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(out_dir: str, ep: int) -> None:
    worker = core_worker()
    env, model, _ = worker.sharded_model(ep)
    get_plugin_manager().register(worker.FusedExperts(), name="fused-experts")
    main_rank = env.is_main
    exporter = WeightExporter(model, bucket_bytes=worker.BUCKET, dtype=None, is_main=main_rank,
                              entry_filter=DeltaTracker())
    delta_sink = StateDictDeltaSink() if main_rank else None
    exporter.export(delta_sink)
    with torch.no_grad():  # one expert of the last ep rank's block moves
        if env.rank == env.world_size - 1:
            local_tensor(model.model.layers[1].mlp.experts.down_proj)[0] += 0.5
    stats = exporter.export(delta_sink)
    after = StateDictDeltaSink() if main_rank else None
    WeightExporter(model, bucket_bytes=worker.BUCKET, dtype=None, is_main=main_rank).export(after)
    if main_rank:
        torch.save({"delta": delta_sink.weights, "after": after.weights,
                    "delta_bytes": stats.bytes_sent}, Path(out_dir) / "result.pt")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
    shutdown_distributed()
    end_torchrun_worker()
