"""Streamed export in process: slot discovery, buckets, an exporter's filter, failure isolation
(graft-vllm's delta export: tests/vllm/test_delta.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from graft import hookimpl
from graft.export.context import ExportContext
from graft.export.handlers import enumerate_hf_slots, meta_skeleton
from graft.export.sinks.base import StateDictSink
from graft.export.sinks.hf_dir import HFDirectorySink
from graft.export.stream import WeightExporter
from graft.training.trainer import Trainer


def exporter(trainer: Trainer, **kwargs) -> WeightExporter:
    options = {"bucket_bytes": 1 << 20, "dtype": None, "is_main": True} | kwargs
    return WeightExporter(trainer.engine.model, **options)


def test_enumerate_hf_slots_splits_fused_experts_without_data(trained_moe: Trainer) -> None:
    model = trained_moe.engine.model
    ctx = ExportContext(model, "qwen3_moe", meta_skeleton(model))
    slots = enumerate_hf_slots("model.layers.1.mlp.experts.gate_up_proj", (8, 64, 64),
                               torch.float32, ctx)
    assert len(slots) == 16
    assert ("model.layers.1.mlp.experts.7.up_proj.weight", (32, 64)) in slots
    assert enumerate_hf_slots("lm_head.weight", (128, 64), torch.float32, ctx) == [
        ("lm_head.weight", (128, 64))]


def test_hook_graft_export_slots_plugin_handler_wins(trained_moe: Trainer, graft_plugin) -> None:
    class RenameHead:
        @hookimpl
        def graft_export_slots(self, name, tensor):
            return [("output.weight", tensor)] if name == "lm_head.weight" else None

    graft_plugin(RenameHead(), name="rename-head")
    sink = StateDictSink()
    exporter(trained_moe).export(sink)
    assert "output.weight" in sink.weights and "lm_head.weight" not in sink.weights
    assert "model.layers.0.mlp.experts.3.down_proj.weight" in sink.weights


def test_small_buckets_stream_the_same_weights(trained_moe: Trainer) -> None:
    small, large = StateDictSink(), StateDictSink()
    small_stats = exporter(trained_moe, bucket_bytes=16 << 10).export(small)
    exporter(trained_moe, bucket_bytes=64 << 20).export(large)
    assert small_stats.buckets > 10
    assert small.weights.keys() == large.weights.keys()
    assert all(torch.equal(small.weights[k], large.weights[k]) for k in small.weights)


def test_failed_export_leaves_the_previous_directory(trained_moe: Trainer, tmp_path: Path,
                                                     graft_plugin) -> None:
    out = tmp_path / "hf"
    model = trained_moe.engine.model
    exporter(trained_moe).export(HFDirectorySink(out, config=model.config))
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    consumer = StateDictSink()
    exporter(trained_moe).export(consumer)
    previous = {k: v.clone() for k, v in consumer.weights.items()}

    class Broken:
        @hookimpl
        def graft_export_slots(self, name):
            if name.endswith("layers.1.mlp.gate.weight"):
                raise RuntimeError("handler bug")

    graft_plugin(Broken(), name="broken-handler")
    with pytest.raises(RuntimeError, match="handler bug"):
        exporter(trained_moe, bucket_bytes=4 << 10).export(HFDirectorySink(out, config=model.config))
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]
    with torch.no_grad():
        trained_moe.engine.model.lm_head.weight.to_local().add_(1.0)  # new weights, never delivered
    with pytest.raises(RuntimeError, match="handler bug"):
        exporter(trained_moe, bucket_bytes=4 << 10).export(consumer)  # staged, then aborted
    assert all(torch.equal(consumer.weights[k], v) for k, v in previous.items())
    with torch.no_grad():
        trained_moe.engine.model.lm_head.weight.to_local().sub_(1.0)
