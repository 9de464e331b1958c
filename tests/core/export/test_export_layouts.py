"""Export layouts, in process: row blocks (assembly, buckets), each sink's consumer and its own
copy plan, handlers' views that tile a parameter planned as copies (graft-vllm's sink, delta
export and per-expert names of fused tensors: tests/vllm)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig

from graft import hookimpl
from graft.config import ModelConfig
from graft.errors import GraftError
from graft.export.bucket import Bucket
from graft.export.copy_plan import plan_copies
from graft.export.handlers import _tile_offsets
from graft.export.sinks.base import RowAssembler, RowBlock, StateDictSink
from graft.export.sinks.hf_dir import HFDirectorySink
from graft.export.stream import WeightExporter, sink_consumer
from graft.models import build_model

FUSED = torch.arange(8 * 3 * 2, dtype=torch.float32).view(8, 3, 2)


def blocks(tensor: torch.Tensor, size: int, name: str = "x.experts.w") -> list[RowBlock]:
    return [RowBlock(name, tensor[row:row + size].clone(), row, tuple(tensor.shape))
            for row in range(0, tensor.shape[0], size)]


def test_assembler_builds_whole_tensors_from_blocks_in_any_order() -> None:
    assembler = RowAssembler()
    *first, last = blocks(FUSED, 2)[::-1]
    assert all(assembler.add(block) is None for block in first)
    with pytest.raises(GraftError, match="rows of x.experts.w never arrived"):
        assembler.check_complete()
    assert torch.equal(assembler.add(last), FUSED)
    assembler.check_complete()
    with pytest.raises(GraftError, match="fall outside"):
        assembler.add(RowBlock("y", torch.zeros(2, 3), 7, (8, 3)))


def test_bucket_keeps_row_blocks_apart_from_whole_tensors() -> None:
    bucket = Bucket(4096, torch.device("cpu"))
    block = blocks(FUSED, 4)[1]
    assert bucket.add("whole", torch.ones(5))
    assert bucket.add(block.name, block.values, rows=(block.row_offset, block.full_shape))
    assert [name for name, _ in bucket.views()] == ["whole"]
    (got,) = bucket.row_blocks()
    assert (got.name, got.row_offset, got.full_shape) == ("x.experts.w", 4, (8, 3, 2))
    assert torch.equal(got.values, block.values)


def test_each_sink_names_its_consumer() -> None:
    assert sink_consumer(None) == sink_consumer(StateDictSink()) == "hf"

    class Engine(StateDictSink):
        consumer = "inference"

    assert sink_consumer(Engine()) == "inference"

    class Odd(StateDictSink):
        consumer = "onnx"

    with pytest.raises(ValueError, match="Odd.consumer='onnx'"):
        sink_consumer(Odd())


def test_hf_directory_assembles_row_blocks_and_refuses_missing_rows(tmp_path: Path) -> None:
    config = AutoConfig.for_model("llama", hidden_size=8, num_hidden_layers=1,
                                  num_attention_heads=2, intermediate_size=8, vocab_size=16)
    sink = HFDirectorySink(tmp_path / "hf", config=config)
    sink.begin()
    sink.consume_rows(blocks(FUSED, 2))
    sink.finish()
    assert torch.equal(load_file(tmp_path / "hf" / "model.safetensors")["x.experts.w"], FUSED)
    assert sink.shapes == {"x.experts.w": (8, 3, 2)}
    sink.begin()
    sink.consume_rows(blocks(FUSED, 2)[:3])
    with pytest.raises(GraftError, match="never arrived"):
        sink.finish()
    sink.abort(GraftError("incomplete"))
    assert torch.equal(load_file(tmp_path / "hf" / "model.safetensors")["x.experts.w"], FUSED)


def test_each_consumer_gets_its_own_plan(graft_plugin) -> None:
    class EngineHeadName:
        @hookimpl
        def graft_export_slots(self, name, tensor, ctx):
            if ctx.consumer == "inference" and name == "lm_head.weight":
                return [("engine_head", tensor)]
            return None

    class EngineStateDict(StateDictSink):
        consumer = "inference"

    graft_plugin(EngineHeadName(), name="engine-head-name")
    model, _ = build_model(ModelConfig(preset="tiny-llama"))
    exporter = WeightExporter(model, bucket_bytes=4 << 20, dtype=None, is_main=True)
    assert exporter.copy_plan is not None  # a HF checkpoint: copies only
    hf, engine = StateDictSink(), EngineStateDict()
    exporter.export(hf)
    exporter.export(engine)  # the handler renames for this consumer
    assert "lm_head.weight" in hf.weights and "engine_head" not in hf.weights
    assert set(engine.weights) == set(hf.weights) - {"lm_head.weight"} | {"engine_head"}
    assert torch.equal(engine.weights["engine_head"], hf.weights["lm_head.weight"])


class RowSlices:
    """A handler that exports one MLP weight of tiny-llama row by row, as views (``copy=False``:
    they tile the parameter) or as copies."""

    NAME = "model.layers.0.mlp.down_proj.weight"

    def __init__(self, *, copy: bool) -> None:
        self.copy = copy

    @hookimpl
    def graft_export_slots(self, name, tensor, ctx):
        if name != self.NAME:
            return None
        rows = [tensor[row] for row in range(tensor.shape[0])]
        return [(f"{name}.row{index}", row.clone() if self.copy else row)
                for index, row in enumerate(reversed(rows))]


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_views_tiling_a_parameter_follow_the_copy_plan(graft_plugin, dtype) -> None:
    model, _ = build_model(ModelConfig(preset="tiny-llama"))
    options = {"bucket_bytes": 1 << 20, "dtype": dtype, "is_main": True}
    graft_plugin(RowSlices(copy=True), name="row-copies")  # copies: streamed
    assert plan_copies(model, bucket=None, bucket_bytes=1 << 20, dtype=dtype) is None
    streamed = StateDictSink()
    WeightExporter(model, **options).export(streamed)
    graft_plugin(RowSlices(copy=False), name="row-views")  # registered last: asked first
    exporter = WeightExporter(model, **options)
    assert exporter.copy_plan is not None  # views that tile the parameter: copies only
    planned = StateDictSink()
    stats = exporter.export(planned)
    assert list(planned.weights) == list(streamed.weights)  # same names, same order
    assert all(torch.equal(planned.weights[k], streamed.weights[k]) for k in streamed.weights)
    assert f"{RowSlices.NAME}.row0" in planned.weights and RowSlices.NAME not in planned.weights
    assert stats.tensors == len(planned.weights)


def test_only_contiguous_views_covering_every_element_once_tile() -> None:
    whole = torch.empty(4, 6, device="meta")
    assert _tile_offsets(whole, [whole[2:], whole[:2]]) == (12, 0)
    assert _tile_offsets(whole, [whole]) == (0,)
    assert _tile_offsets(whole, [whole[:2], whole[1:]]) is None  # overlapping
    assert _tile_offsets(whole, [whole[:2], whole[3:]]) is None  # a gap
    assert _tile_offsets(whole, [whole[:, :3], whole[:, 3:]]) is None  # not contiguous
    assert _tile_offsets(whole, [whole.clone()]) is None  # a copy
    assert _tile_offsets(whole, [whole.view(torch.int32)]) is None  # another dtype
