"""Streamed export in process: slot discovery, buckets, delta against full, failure isolation."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from graft import hookimpl
from graft.config import compose
from graft.export.context import ExportContext
from graft.export.handlers import enumerate_hf_slots, meta_skeleton
from graft.export.sinks.hf_dir import HFDirectorySink
from graft.export.sinks.state_dict import StateDictSink
from graft.export.stream import WeightExporter
from graft.training.trainer import Trainer


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Trainer:
    run_dir = tmp_path_factory.mktemp("export-run")
    cfg = compose([f"trainer.run_dir={run_dir}", "trainer.total_steps=1",
                   "model.preset=tiny-qwen3-moe", "engine.device=cpu", "optim.lr=1e-4",
                   "trainer.mode=sft",
                   "export.hf_at_end=false", "checkpoint.every_steps=0"])
    trainer = Trainer(cfg)
    trainer.fit()
    return trainer


def exporter(trainer: Trainer, **kwargs) -> WeightExporter:
    options = {"bucket_bytes": 1 << 20, "dtype": None, "delta": False, "is_main": True} | kwargs
    return WeightExporter(trainer.engine.model, **options)


def test_enumerate_hf_slots_splits_fused_experts_without_data(trained: Trainer) -> None:
    model = trained.engine.model
    ctx = ExportContext(model, "qwen3_moe", meta_skeleton(model))
    slots = enumerate_hf_slots("model.layers.1.mlp.experts.gate_up_proj", (8, 64, 64),
                               torch.float32, ctx)
    assert len(slots) == 16
    assert ("model.layers.1.mlp.experts.7.up_proj.weight", (32, 64)) in slots
    assert enumerate_hf_slots("lm_head.weight", (128, 64), torch.float32, ctx) == [
        ("lm_head.weight", (128, 64))]


def test_hook_graft_export_slots_plugin_handler_wins(trained: Trainer, graft_plugin) -> None:
    class RenameHead:
        @hookimpl
        def graft_export_slots(self, name, tensor):
            return [("output.weight", tensor)] if name == "lm_head.weight" else None

    graft_plugin(RenameHead(), name="rename-head")
    sink = StateDictSink()
    exporter(trained).export(sink)
    assert "output.weight" in sink.weights and "lm_head.weight" not in sink.weights
    assert "model.layers.0.mlp.experts.3.down_proj.weight" in sink.weights


def test_small_buckets_stream_the_same_weights(trained: Trainer) -> None:
    small, large = StateDictSink(), StateDictSink()
    small_stats = exporter(trained, bucket_bytes=16 << 10).export(small)
    exporter(trained, bucket_bytes=64 << 20).export(large)
    assert small_stats.buckets > 10
    assert small.weights.keys() == large.weights.keys()
    assert all(torch.equal(small.weights[k], large.weights[k]) for k in small.weights)


def test_delta_after_a_training_step_matches_a_full_export(trained: Trainer) -> None:
    delta_exporter = exporter(trained, delta=True, dtype=torch.bfloat16)
    consumer = StateDictSink()
    first = delta_exporter.export(consumer)
    assert not first.delta and first.bytes_sent == first.bytes_total
    trained.cfg.optim.lr = 1e-6  # an RL-sized step: most bf16 values do not move
    for group in trained.engine.optimizer.param_groups:
        group["lr"] = 1e-6
    trained.train_step()
    second = delta_exporter.export(consumer)
    reference = StateDictSink()
    exporter(trained, dtype=torch.bfloat16).export(reference)
    assert second.delta and 0 < second.bytes_sent < second.bytes_total
    assert consumer.weights.keys() == reference.weights.keys()
    for name, tensor in reference.weights.items():
        assert torch.equal(consumer.weights[name], tensor), name
    print(f"delta export after an AdamW step at lr 1e-6: {second.bytes_sent} of "
          f"{second.bytes_total} bytes ({second.bytes_sent / second.bytes_total:.1%})")


def test_delta_after_a_sparse_update_sends_only_changed_rows(trained: Trainer) -> None:
    delta_exporter = exporter(trained, delta=True)
    consumer = StateDictSink()
    delta_exporter.export(consumer)
    model = trained.engine.model
    with torch.no_grad():  # three vocabulary rows and one expert move, as a sparse update would
        model.model.embed_tokens.weight.to_local()[[5, 17, 42]] += 0.5
        model.model.layers[1].mlp.experts.down_proj.to_local()[3] *= 1.5
    stats = delta_exporter.export(consumer)
    reference = StateDictSink()
    exporter(trained).export(reference)
    for name, tensor in reference.weights.items():
        assert torch.equal(consumer.weights[name], tensor), name
    changed = 3 * 64 * 4 + 3 * 8 + 64 * 32 * 4  # 3 embedding rows (+ indices) and one expert
    assert stats.bytes_sent == changed
    print(f"delta export after a sparse update: {stats.bytes_sent} of {stats.bytes_total} bytes "
          f"({stats.bytes_sent / stats.bytes_total:.2%})")


def test_failed_export_leaves_the_previous_directory(trained: Trainer, tmp_path: Path,
                                                     graft_plugin) -> None:
    out = tmp_path / "hf"
    model = trained.engine.model
    exporter(trained).export(HFDirectorySink(out, config=model.config))
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    consumer = StateDictSink()
    exporter(trained).export(consumer)
    previous = {k: v.clone() for k, v in consumer.weights.items()}

    class Broken:
        @hookimpl
        def graft_export_slots(self, name):
            if name.endswith("layers.1.mlp.gate.weight"):
                raise RuntimeError("handler bug")

    graft_plugin(Broken(), name="broken-handler")
    with pytest.raises(RuntimeError, match="handler bug"):
        exporter(trained, bucket_bytes=4 << 10).export(HFDirectorySink(out, config=model.config))
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]
    with torch.no_grad():
        trained.engine.model.lm_head.weight.to_local().add_(1.0)  # new weights, never delivered
    with pytest.raises(RuntimeError, match="handler bug"):
        exporter(trained, bucket_bytes=4 << 10).export(consumer)  # staged, then aborted
    assert all(torch.equal(consumer.weights[k], v) for k, v in previous.items())
    with torch.no_grad():
        trained.engine.model.lm_head.weight.to_local().sub_(1.0)
