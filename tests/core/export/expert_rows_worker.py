"""Worker for test_expert_rows.py: a tiny Qwen3-MoE whose experts are split over ``ep`` with
`graft.engine.distributed.expert_parallel` (no model plugin), exported with a handler that keeps the experts
fused (renamed ``experts.fused_<param>``): the core streams each ep rank's block as rows of the
fused HF tensor. Run under ``torchrun --nproc-per-node N expert_rows_worker.py OUT_DIR EP``.

Rank 0 saves ``OUT_DIR/result.pt``: the whole parameters, what each sink received (a HF
directory, a state dict recording its row blocks, a sink that takes only whole tensors), and an
export through an `ExportFilter` that sends the row blocks of the fused ``down_proj`` tensors to
the sink on their own (graft-vllm's delta export of them: tests/vllm/test_delta.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch.distributed.fsdp import MixedPrecisionPolicy

from graft import hookimpl
from graft.config import compose
from graft.engine.distributed.env import end_torchrun_worker, init_distributed, shutdown_distributed
from graft.engine.distributed.expert_parallel import apply_expert_parallel
from graft.engine.distributed.parallelize import apply_fsdp
from graft.export import RowBlock
from graft.export.sinks.base import StateDictSink
from graft.export.sinks.hf_dir import HFDirectorySink
from graft.export.stream import WeightExporter
from graft.models import build_model
from graft.plugins import get_plugin_manager

BUCKET = 48 << 10  # a down_proj block (32 KiB) fits, a gate_up_proj block (64 KiB) bypasses it


class FusedExperts:
    """Keeps fused experts fused (renamed), as a model whose checkpoint stores them so would."""

    @hookimpl
    def graft_export_slots(self, name, tensor):
        if ".mlp.experts." in name:
            return [(name.replace(".experts.", ".experts.fused_"), tensor)]
        return None


class RecordingSink(StateDictSink):
    """A state dict that records the row blocks it receives: (name, first row, rows)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks: list[tuple[str, int, int]] = []

    def consume_rows(self, blocks) -> None:
        self.blocks.extend((b.name, b.row_offset, b.values.shape[0]) for b in blocks)
        super().consume_rows(blocks)


class BlockUpdate:
    """A row block sent outside the bucket: a copy of its values, the first row's index."""

    def __init__(self, block: RowBlock) -> None:
        self.name, self.row_offset, self.values = block.name, block.row_offset, block.values.clone()
        self.nbytes = block.nbytes


class DownProjBlocksApart:
    """An `ExportFilter`: the row blocks of fused ``down_proj`` tensors become `BlockUpdate`s,
    every other entry travels as usual."""

    def begin(self) -> bool:
        return True

    def tensor(self, name, tensor):
        return tensor

    def rows(self, block):
        return BlockUpdate(block) if "down_proj" in block.name else block


class UpdatingSink(StateDictSink):
    """A state dict that keeps the updates it is given as (name, first row, values)."""

    def __init__(self) -> None:
        super().__init__()
        self.updates: list[tuple[str, int, torch.Tensor]] = []

    def consume_updates(self, updates) -> None:
        self.updates.extend((u.name, u.row_offset, u.values) for u in updates)


class WholeTensorSink:
    """The smallest sink: whole tensors only (no consume_rows)."""

    def __init__(self) -> None:
        self.weights: dict[str, torch.Tensor] = {}

    def begin(self) -> None:
        self.weights = {}

    def consume(self, tensors) -> None:
        self.weights.update({name: t.detach().clone() for name, t in tensors})

    def finish(self) -> None:
        pass

    def abort(self, error) -> None:
        pass


def sharded_model(ep: int):
    env = init_distributed(device_preference="cpu", ep_size=ep)
    cfg = compose(["model.preset=tiny-qwen3-moe", "engine.device=cpu"])
    model, family = build_model(cfg.model)
    params = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    blocks = list(family.decoder_blocks(model))
    experts = [block.mlp.experts for block in blocks]
    for module in experts:
        apply_expert_parallel(module, env.meshes["ep"])
    apply_fsdp(model, blocks, env.mesh, expert_modules=experts, expert_mesh=env.meshes["efsdp"],
               mp_policy=MixedPrecisionPolicy(), reshard_after_forward=True)
    return env, model, params


def export(model, sink, *, is_main: bool, entry_filter=None):
    exporter = WeightExporter(model, bucket_bytes=BUCKET, dtype=None, is_main=is_main,
                              entry_filter=entry_filter)
    return exporter.export(sink if is_main else None)


def main(out_dir: str, ep: int) -> None:
    env, model, params = sharded_model(ep)
    get_plugin_manager().register(FusedExperts(), name="fused-experts")
    main_rank, out = env.is_main, Path(out_dir)
    result: dict = {"params": params}
    hf_dir = HFDirectorySink(out / "hf", config=model.config)
    recording, whole = RecordingSink(), WholeTensorSink()
    for label, sink in (("hf", hf_dir), ("rows", recording), ("whole", whole)):
        result[f"{label}_bytes"] = export(model, sink, is_main=main_rank).bytes_sent
    filtered = UpdatingSink()
    stats = export(model, filtered, is_main=main_rank, entry_filter=DownProjBlocksApart())
    if main_rank:
        result.update(hf=load_file(out / "hf" / "model.safetensors"), rows=recording.weights,
                      blocks=recording.blocks, whole=whole.weights, filtered=filtered.weights,
                      updates=filtered.updates, filtered_bytes=stats.bytes_sent)
        torch.save(result, out / "result.pt")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
    shutdown_distributed()
    end_torchrun_worker()
