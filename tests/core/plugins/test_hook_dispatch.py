"""Each hook reaches an installed plugin's implementation with the documented arguments.

The flow tests (training, checkpoint, export) check that the core calls each hook at the right
moment; these check the dispatch contract itself: keyword arguments, subsets of arguments,
firstresult semantics and in-place mutation.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from graft.checkpoint import LoadContext
from graft.config import ModelConfig
from graft.engine import SequenceShard
from graft.engine.batch.micro_batch import layout_rows
from graft.export.context import ExportContext
from graft.models import build_model
from graft.plugins import GraftPluginManager


@pytest.fixture
def manager(plugin_sites: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
            clean_env: None) -> GraftPluginManager:
    monkeypatch.syspath_prepend(str(plugin_sites["demo"]))
    loaded = GraftPluginManager()
    loaded.load()
    return loaded


def calls(kind: str) -> list[tuple]:
    from graft_demo.plugin import CALLS

    return [c for c in CALLS if c[0] == kind]


def test_hook_graft_prepare_inputs_extends_per_token_tensors(manager: GraftPluginManager) -> None:
    layout = layout_rows([5], packs_sequences=True, pad_bucket=4)
    batch = {"input_ids": torch.zeros(1, 8, dtype=torch.long), "demo_flags": torch.ones(1, 5)}
    whole_rows = SequenceShard(rank=0, size=1, row_length=layout.row_length, layout=layout)
    manager.hook.graft_prepare_inputs(batch=batch, pad_size=layout.pad_size, layout=layout,
                                      cfg=None, phase="update", shard=whole_rows)
    assert batch["demo_flags"].shape == (1, 8)
    assert batch["demo_flags"][0, 5:].sum() == 0


def test_hook_graft_loss_aggregate_is_firstresult(manager: GraftPluginManager) -> None:
    loss = torch.tensor([[1.0, 5.0], [2.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    result = manager.hook.graft_loss_aggregate(loss_mat=loss, loss_mask=mask, mode="demo-max",
                                               ctx=None)
    assert result == 5.0
    assert manager.hook.graft_loss_aggregate(loss_mat=loss, loss_mask=mask, mode="unknown",
                                             ctx=None) is None


def test_hook_graft_ckpt_load_mutates_state(manager: GraftPluginManager, tmp_path: Path) -> None:
    ctx = LoadContext(tmp_path / "step_3", 3, 2, frozenset({"optim.state.v.exp_avg"}))
    state = {"model": {}, "optim": {"state.v.exp_avg": torch.ones(2),
                                    "state.w.exp_avg": torch.zeros(2)}}
    manager.hook.graft_ckpt_load(state=state, model=None, optimizer=None, ctx=ctx)
    assert state["demo_seen"] is True                      # the plugin ran
    assert ctx.keep_fresh == {"optim.state.w.exp_avg"}     # and then the core's backfill
    assert ctx.backfilled == ["state.w.exp_avg"]


def test_hook_graft_export_slots_maps_or_passes(manager: GraftPluginManager) -> None:
    model, _ = build_model(ModelConfig(preset="tiny-llama"))
    ctx = ExportContext(model, "llama", model)
    tensor = torch.arange(8.0).reshape(4, 2)
    slots = manager.hook.graft_export_slots(name="layers.0.demo_fused.weight", tensor=tensor,
                                            ctx=ctx)
    assert [name for name, _ in slots] == ["layers.0.demo_a.weight", "layers.0.demo_b.weight"]
    assert torch.equal(slots[1][1], tensor[2:])
    # the demo plugin passes (None); the core's default handler answers last
    head = model.lm_head.weight.detach()
    assert manager.hook.graft_export_slots(name="lm_head.weight", tensor=head, ctx=ctx) == [
        ("lm_head.weight", head)]
