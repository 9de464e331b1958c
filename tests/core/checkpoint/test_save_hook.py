"""``graft_ckpt_save``: a plugin leaves entries out of a checkpoint (a frozen parameter it
rebuilds on resume); the checkpoint on disk lacks them, and a resume loads when the same plugin
keeps them fresh (``graft_ckpt_load``: ``ctx.keep_fresh``) and fails naming them when it does
not. The core alone: a test plugin, a real SFT run of tiny-llama on CPU, real DCP checkpoints."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.checkpoint import FileSystemReader

from graft import hookimpl
from graft.checkpoint.layout import read_latest
from graft.config import compose
from graft.errors import CheckpointError
from graft.training.trainer import Trainer

FROZEN = "model.norm.weight"  # the final norm: frozen by the plugin, left out of checkpoints


class DropsFrozen:
    """Freezes ``FROZEN`` before sharding and leaves it out of every checkpoint it saves."""

    def __init__(self) -> None:
        self.saved: list[set[str]] = []  # the model entries each save offered, before the drop

    @hookimpl
    def graft_pre_shard(self, model: torch.nn.Module, role: str) -> None:
        if role == "policy":
            model.get_parameter(FROZEN).requires_grad_(False)

    @hookimpl
    def graft_ckpt_save(self, state: dict[str, Any]) -> None:
        self.saved.append(set(state["model"]))
        del state["model"][FROZEN]


class KeepsFrozenFresh(DropsFrozen):
    """`DropsFrozen`, and on resume keeps ``FROZEN`` as the build made it (not read)."""

    @hookimpl
    def graft_ckpt_load(self, ctx: Any) -> None:
        if f"model.{FROZEN}" not in ctx.checkpoint_keys:
            ctx.keep_fresh.add(f"model.{FROZEN}")


def trainer(run_dir: Path, steps: int) -> Trainer:
    return Trainer(compose([f"trainer.run_dir={run_dir}", f"trainer.total_steps={steps}",
                            "model.preset=tiny-llama", "engine.device=cpu", "trainer.mode=sft",
                            "checkpoint.every_steps=2", "export.hf_at_end=false"]))


def weights(run: Trainer) -> dict[str, torch.Tensor]:
    return {name: param.full_tensor().clone()
            for name, param in run.engine.model.named_parameters()}


def checkpoint_keys(run_dir: Path) -> set[str]:
    """The keys the run's latest checkpoint holds, as its DCP metadata lists them."""
    path = read_latest(run_dir)
    assert path is not None and path.name == "step_2"
    return set(FileSystemReader(str(path)).read_metadata().state_dict_metadata)


def test_hook_graft_ckpt_save_leaves_an_entry_out_and_a_resume_keeps_it_fresh(
        graft_plugin, tmp_path: Path) -> None:
    plugin = KeepsFrozenFresh()
    graft_plugin(plugin, name="keeps-frozen-fresh")
    first = trainer(tmp_path, 2)
    first.fit()
    trained = weights(first)
    assert plugin.saved and all(FROZEN in offered for offered in plugin.saved)
    keys = checkpoint_keys(tmp_path)
    assert f"model.{FROZEN}" not in keys
    assert {f"model.{name}" for name in trained} - keys == {f"model.{FROZEN}"}  # the rest is there
    assert not any(FROZEN in key for key in keys)  # no optimizer state either: it is frozen

    resumed = trainer(tmp_path, 3)
    assert resumed.step == 2
    loaded = weights(resumed)
    assert loaded.keys() == trained.keys()
    for name, value in loaded.items():  # trained weights read back; the frozen one as built
        assert torch.equal(value, trained[name]), name
    assert not resumed.engine.model.get_parameter(FROZEN).requires_grad
    resumed.fit()  # and it trains on
    assert resumed.step == 3


def test_an_entry_left_out_and_not_kept_fresh_fails_the_resume_naming_it(
        graft_plugin, tmp_path: Path) -> None:
    graft_plugin(DropsFrozen(), name="drops-frozen")
    trainer(tmp_path, 2).fit()
    assert f"model.{FROZEN}" not in checkpoint_keys(tmp_path)
    with pytest.raises(CheckpointError, match=re.escape(f"has no parameter '{FROZEN}'")):
        trainer(tmp_path, 3)
