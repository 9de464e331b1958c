"""Checkpoints in process: backfill of missing optimizer state, crash mid-save, unsafe files."""

from __future__ import annotations

import logging
import os
import pickle
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.state_dict import get_state_dict

from graft import hookimpl
from graft.checkpoint.layout import read_latest
from graft.checkpoint.manager import OPTIONS
from graft.config import compose
from graft.errors import CheckpointError
from graft.training.trainer import Trainer


def trainer(run_dir: Path, steps: int, *overrides: str) -> Trainer:
    cfg = compose([f"trainer.run_dir={run_dir}", f"trainer.total_steps={steps}",
                   "model.preset=tiny-llama", "engine.device=cpu", "checkpoint.every_steps=2",
                   "trainer.mode=sft",
                   *overrides])
    return Trainer(cfg)


class UnusedHead:
    """Adds a module whose output the loss never uses (like DeepSeek-V4's indexer)."""

    @hookimpl
    def graft_pre_shard(self, model):
        model.model.unused_head = torch.nn.Linear(64, 8)


def optimizer_entries(trainer: Trainer) -> dict[str, torch.Tensor]:
    _, optim = get_state_dict(trainer.engine.model, trainer.engine.optimizer, options=OPTIONS)
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).clone()
            for k, v in optim.items() if k.startswith("state.")}


def test_hook_graft_ckpt_load_backfills_params_without_gradients(graft_plugin, tmp_path: Path,
                                                                 caplog) -> None:
    caplog.set_level(logging.INFO, logger="graft.checkpoint")
    graft_plugin(UnusedHead(), name="unused-head")
    first = trainer(tmp_path, 2)
    first.fit()
    saved = optimizer_entries(first)
    assert not any("unused_head" in k for k in saved), "no gradient, so no Adam state was saved"
    resumed = trainer(tmp_path, 3)
    assert resumed.step == 2
    loaded = optimizer_entries(resumed)
    fresh_trainer = trainer(tmp_path / "fresh", 3, "checkpoint.resume=never")
    fresh = optimizer_entries(fresh_trainer)
    for key, value in loaded.items():
        expected = fresh[key] if "unused_head" in key else saved[key]
        assert torch.equal(value, expected), key
    assert any("unused_head" in k for k in loaded)
    assert "2 parameters had no optimizer state" in caplog.text
    assert "model.unused_head.bias" in caplog.text
    resumed.fit()  # and it trains on


class RenamedLayout:
    """Reads the checkpoint's two layer norms of layer 0 into each other's places, as a plugin
    migrating an older layout (where the names differed) would, before any check or read."""

    a, b = "model.layers.0.input_layernorm.weight", "model.layers.0.post_attention_layernorm.weight"

    @hookimpl(tryfirst=True)
    def graft_ckpt_load(self, state):
        model = state["model"]
        model[self.a], model[self.b] = model[self.b], model[self.a]


def full(trainer: Trainer, name: str) -> torch.Tensor:
    value = dict(trainer.engine.model.named_parameters())[name]
    return value.full_tensor().detach().clone()


def test_hook_graft_ckpt_load_renames_before_the_check_and_the_read(graft_plugin,
                                                                    tmp_path: Path) -> None:
    first = trainer(tmp_path, 2)
    first.fit()
    a, b = RenamedLayout.a, RenamedLayout.b
    saved_a, saved_b = full(first, a), full(first, b)
    assert not torch.equal(saved_a, saved_b), "the norms must have trained apart"
    graft_plugin(RenamedLayout(), name="renamed")
    resumed = trainer(tmp_path, 3)
    assert torch.equal(full(resumed, a), saved_b) and torch.equal(full(resumed, b), saved_a)


def test_hook_graft_ckpt_load_keep_fresh_skips_an_entry(graft_plugin, tmp_path: Path) -> None:
    class FreshNorm:
        @hookimpl
        def graft_ckpt_load(self, ctx):
            ctx.keep_fresh.add("model.model.norm.weight")  # <section>.<entry key>

    first = trainer(tmp_path, 2)
    first.fit()
    assert not torch.equal(full(first, "model.norm.weight"), torch.ones(64))
    graft_plugin(FreshNorm(), name="fresh-norm")
    resumed = trainer(tmp_path, 3)
    assert torch.equal(full(resumed, "model.norm.weight"), torch.ones(64))  # as initialised


def test_an_entry_the_checkpoint_lacks_is_named_after_the_hooks(graft_plugin,
                                                                tmp_path: Path) -> None:
    class Misnamed:
        @hookimpl
        def graft_ckpt_load(self, state):
            state["model"]["model.norm.scale"] = state["model"].pop("model.norm.weight")

    trainer(tmp_path, 2).fit()
    graft_plugin(Misnamed(), name="misnamed")
    with pytest.raises(CheckpointError, match="has no parameter 'model.norm.scale'"):
        trainer(tmp_path, 3)


def test_crash_between_shard_writes_keeps_the_previous_checkpoint(tmp_path: Path,
                                                                  monkeypatch) -> None:
    run = trainer(tmp_path, 4)
    run.train_step()
    run.train_step()
    run.save_checkpoint()
    assert read_latest(tmp_path).name == "step_2"
    original = FileSystemWriter.write_data

    def write_then_die(self, plan, planner):
        original(self, plan, planner).wait()  # the shards hit the disk...
        raise OSError("simulated crash before the metadata is written")

    monkeypatch.setattr(FileSystemWriter, "write_data", write_then_die)
    run.train_step()
    run.train_step()
    with pytest.raises(CheckpointError, match="saving checkpoint step_4.*simulated crash"):
        run.save_checkpoint()
    monkeypatch.undo()
    assert read_latest(tmp_path).name == "step_2"
    assert not (tmp_path / "checkpoints" / "step_4").exists()
    again = trainer(tmp_path, 4)
    assert again.step == 2
    again.fit()
    assert read_latest(tmp_path).name == "step_4"
    assert not list((tmp_path / "checkpoints").glob(".tmp-*")), "stale partial saves are pruned"


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    trainer(tmp_path, 2).fit()
    return tmp_path / "checkpoints" / "step_2"


def test_malicious_metadata_is_refused_without_running(saved: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    (saved / ".metadata").write_bytes(pickle.dumps(Payload()))
    with pytest.raises(CheckpointError, match=r"\.metadata is unreadable.*not allowed"):
        from graft.checkpoint.safe_io import read_metadata

        read_metadata(saved)
    assert not marker.exists()


def test_truncated_shard_is_named_before_anything_loads(saved: Path, tmp_path: Path) -> None:
    shard = next(saved.glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(CheckpointError, match=f"{shard.name} has 100 bytes.*truncated"):
        trainer(tmp_path, 3)


def test_corrupted_byte_is_caught_by_the_checksum(saved: Path, tmp_path: Path) -> None:
    shard = next(saved.glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=f"{shard.name} is corrupted"):
        trainer(tmp_path, 3)


def test_changed_model_shape_names_the_parameter(saved: Path, tmp_path: Path) -> None:
    with pytest.raises(CheckpointError,
                       match=r"'model.layers.0.mlp.gate_proj.weight' has shape \(128, 64\) there "
                             r"but \(96, 64\)"):
        trainer(tmp_path, 3, "+model.overrides.intermediate_size=96")
