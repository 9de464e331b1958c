"""graft-vllm's delta export (``features.vllm.delta``, `graft_vllm.delta`) through the core's
exporter, and the per-expert names of fused tensors: row blocks sent first whole, then only
changed rows; a delta after a training step or a sparse update equals a full export; on 2 gloo
ranks with the experts split over ep (`scripts/delta_expert_rows.py`), only the changed expert
row leaves the trainer. The engine's own delta sync: test_sink.py.

None of these need vLLM itself (not marked ``vllm``: the newest-transformers leg runs them)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from graft.export import RowBlock, WeightExporter
from graft.export.sinks.base import StateDictSink
from graft.training.trainer import Trainer
from graft_vllm.delta import DeltaEntry, DeltaTracker, StateDictDeltaSink
from graft_vllm.fused_experts import expert_of_fused, fused_name, split_fused

FUSED = torch.arange(8 * 3 * 2, dtype=torch.float32).view(8, 3, 2)
WORKER = Path(__file__).resolve().parent / "scripts" / "delta_expert_rows.py"


def blocks(tensor: torch.Tensor, size: int, name: str = "x.experts.w") -> list[RowBlock]:
    return [RowBlock(name, tensor[row:row + size].clone(), row, tuple(tensor.shape))
            for row in range(0, tensor.shape[0], size)]


def exporter(trainer: Trainer, *, delta: bool = False, dtype=None) -> WeightExporter:
    return WeightExporter(trainer.engine.model, bucket_bytes=1 << 20, dtype=dtype, is_main=True,
                          entry_filter=DeltaTracker() if delta else None)


def test_delta_of_row_blocks_sends_blocks_first_then_changed_rows() -> None:
    tracker = DeltaTracker()
    assert tracker.begin() is False  # nothing exported yet: a full export
    assert all(isinstance(tracker.rows(b), RowBlock) for b in blocks(FUSED, 4))
    changed = FUSED.clone()
    changed[5, 1, 0] += 1.0
    assert tracker.begin() is True
    first, second = (tracker.rows(b) for b in blocks(changed, 4))
    assert first is None
    assert isinstance(second, DeltaEntry) and second.rows.tolist() == [5]
    assert torch.equal(second.values, changed[5:6]) and torch.equal(tracker.snapshot["x.experts.w"],
                                                                    changed)


def test_a_half_recorded_tensor_is_sent_whole_by_the_next_export() -> None:
    tracker = DeltaTracker()
    tracker.begin()
    tracker.diff_rows(blocks(FUSED, 4)[0])  # the export failed before the second block
    tracker.begin()
    assert all(isinstance(tracker.diff_rows(b), RowBlock) for b in blocks(FUSED, 4))


def test_per_expert_names_of_a_fused_tensor() -> None:
    assert fused_name("m.layers.1.mlp.experts.7.gate_up_proj") == (
        "m.layers.1.mlp.experts.gate_up_proj", 7)
    assert fused_name("m.layers.1.mlp.experts.gate_up_proj") is None
    shapes = {"m.experts.down_proj": (8, 3, 2)}
    assert expert_of_fused("m.experts.7.down_proj", (3, 2), shapes)
    assert not expert_of_fused("m.experts.8.down_proj", (3, 2), shapes)  # no expert 8
    assert not expert_of_fused("m.experts.1.down_proj", (2, 3), shapes)
    weights = {"m.experts.down_proj": FUSED.clone(), "other": torch.ones(1)}
    assert split_fused(weights, "m.experts.3.down_proj")
    assert "m.experts.down_proj" not in weights and len(weights) == 9
    assert torch.equal(weights["m.experts.3.down_proj"], FUSED[3])
    assert not split_fused(weights, "m.experts.3.down_proj")


def test_delta_compares_per_expert_tensors_with_a_fused_snapshot() -> None:
    tracker = DeltaTracker()
    assert tracker.tensor("m.experts.w", FUSED) is FUSED  # new: sent whole, in the bucket
    assert tracker.diff("m.experts.2.w", FUSED[2].clone()) is None  # unchanged expert: nothing
    moved = FUSED[6].clone()
    moved[0, 1] = -1.0
    entry = tracker.tensor("m.experts.6.w", moved)
    assert entry.rows.tolist() == [0] and torch.equal(entry.values, moved[:1])


def test_delta_after_a_training_step_matches_a_full_export(trained_moe: Trainer) -> None:
    delta_exporter = exporter(trained_moe, delta=True, dtype=torch.bfloat16)
    consumer = StateDictDeltaSink()
    first = delta_exporter.export(consumer)
    assert not first.partial and first.bytes_sent == first.bytes_total
    trained_moe.cfg.optim.lr = 1e-6  # an RL-sized step: most bf16 values do not move
    for group in trained_moe.engine.optimizer.param_groups:
        group["lr"] = 1e-6
    trained_moe.train_step()
    second = delta_exporter.export(consumer)
    reference = StateDictSink()
    exporter(trained_moe, dtype=torch.bfloat16).export(reference)
    assert second.partial and 0 < second.bytes_sent < second.bytes_total
    assert consumer.weights.keys() == reference.weights.keys()
    for name, tensor in reference.weights.items():
        assert torch.equal(consumer.weights[name], tensor), name
    print(f"delta export after an AdamW step at lr 1e-6: {second.bytes_sent} of "
          f"{second.bytes_total} bytes ({second.bytes_sent / second.bytes_total:.1%})")


def test_delta_after_a_sparse_update_sends_only_changed_rows(trained_moe: Trainer) -> None:
    delta_exporter = exporter(trained_moe, delta=True)
    consumer = StateDictDeltaSink()
    delta_exporter.export(consumer)
    model = trained_moe.engine.model
    with torch.no_grad():  # three vocabulary rows and one expert move, as a sparse update would
        model.model.embed_tokens.weight.to_local()[[5, 17, 42]] += 0.5
        model.model.layers[1].mlp.experts.down_proj.to_local()[3] *= 1.5
    stats = delta_exporter.export(consumer)
    reference = StateDictSink()
    exporter(trained_moe).export(reference)
    for name, tensor in reference.weights.items():
        assert torch.equal(consumer.weights[name], tensor), name
    changed = 3 * 64 * 4 + 3 * 8 + 64 * 32 * 4  # 3 embedding rows (+ indices) and one expert
    assert stats.bytes_sent == changed
    print(f"delta export after a sparse update: {stats.bytes_sent} of {stats.bytes_total} bytes "
          f"({stats.bytes_sent / stats.bytes_total:.2%})")


@pytest.mark.slow
def test_delta_of_a_fused_tensor_sends_only_changed_expert_rows(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node=2", str(WORKER), str(tmp_path), "2"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    result = torch.load(tmp_path / "result.pt")
    assert result["delta"].keys() == result["after"].keys()
    for name, tensor in result["after"].items():
        assert torch.equal(result["delta"][name], tensor), name
    assert result["delta_bytes"] == 64 * 32 * 4 + 8  # one expert's down_proj row + its index
