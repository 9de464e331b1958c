"""``graft_export_entries``: a plugin chooses the tensors an export covers (a value computed when
the export reaches it, an entry left out); the Hugging Face export and the embedded engine's
decode copy (`InferenceCopy`) get them, and an export no plugin answers is the model's own. And
``export_checkpoint_to_hf`` rebuilds what a ``graft_ckpt_save`` plugin left out of a checkpoint
(the run's model built again in this process) and exports the rest from the checkpoint. The
core alone: test plugins, a tiny-llama run on CPU, real DCP checkpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from graft import hookimpl
from graft.checkpoint.layout import read_latest
from graft.config import compose
from graft.export.hf import export_checkpoint_to_hf, export_model_to_hf
from graft.rollout.inference_copy import InferenceCopy
from graft.training.trainer import Trainer

DOUBLED = "model.layers.0.mlp.down_proj.weight"  # exported as weight * 2, computed at export
DROPPED = "model.layers.1.mlp.up_proj.weight"  # left out of exports / checkpoints


class DoublesAndDrops:
    """Exports ``DOUBLED`` as a function computing twice the weight, and not ``DROPPED``."""

    def __init__(self) -> None:
        self.computed = 0  # how often the function ran

    @hookimpl
    def graft_export_entries(self, entries: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
        return [(name, self._doubled(value) if name == DOUBLED else value)
                for name, value in entries if name != DROPPED]

    def _doubled(self, weight: torch.Tensor) -> Any:
        def compute() -> torch.Tensor:
            self.computed += 1
            with torch.no_grad():
                return weight * 2  # a DTensor placed as the weight

        return compute


class Declines:
    """Asked, answers None: the export keeps the core's entries."""

    def __init__(self) -> None:
        self.asked: list[list[str]] = []

    @hookimpl
    def graft_export_entries(self, entries: list[tuple[str, Any]]) -> None:
        self.asked.append([name for name, _ in entries])


class DropsFromCheckpoints:
    @hookimpl
    def graft_ckpt_save(self, state: dict[str, Any]) -> None:
        del state["model"][DROPPED]


def trainer(run_dir: Path, *overrides: str) -> Trainer:
    return Trainer(compose([f"trainer.run_dir={run_dir}", "model.preset=tiny-llama",
                            "engine.device=cpu", "trainer.mode=sft", "trainer.total_steps=1",
                            "checkpoint.every_steps=0", "export.hf_at_end=false", *overrides]))


def weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: param.full_tensor().detach().clone() for name, param in model.named_parameters()}


def export(run: Trainer, out: Path) -> dict[str, torch.Tensor]:
    """``run``'s model exported to ``out`` (a Hugging Face directory), read back."""
    export_model_to_hf(run.engine.model, out, export_cfg=run.cfg.export, tokenizer=run.tokenizer,
                       is_main=True)
    written: dict[str, torch.Tensor] = {}
    for path in sorted(out.glob("*.safetensors")):
        written.update(load_file(path))
    return written


def test_hook_graft_export_entries_computes_one_entry_and_drops_another(
        graft_plugin, tmp_path: Path) -> None:
    run = trainer(tmp_path / "run")
    model = weights(run.engine.model)
    plugin = DoublesAndDrops()
    graft_plugin(plugin, name="doubles-and-drops")
    written = export(run, tmp_path / "hf")
    assert plugin.computed == 1  # once, when the export reached it
    assert DROPPED not in written
    assert written.keys() == model.keys() - {DROPPED}
    for name, tensor in written.items():
        expected = model[name] * 2 if name == DOUBLED else model[name]
        assert torch.equal(tensor, expected.to(tensor.dtype)), name

    copy = InferenceCopy(run.engine.model, dtype=torch.float32, device=torch.device("cpu"),
                         cfg=run.cfg)  # the embedded engine's decode copy
    copied = dict(copy.model.named_parameters())
    assert torch.equal(copied[DOUBLED], model[DOUBLED] * 2)
    for name in model.keys() - {DOUBLED, DROPPED}:
        assert torch.equal(copied[name], model[name]), name
    with torch.no_grad():  # computed at each refresh, from the weight as it is then
        run.engine.model.get_parameter(DOUBLED).add_(1.0)
    copy.refresh()
    assert torch.equal(copied[DOUBLED], (model[DOUBLED] + 1.0) * 2)
    assert plugin.computed == 3


def test_an_export_no_plugin_answers_is_the_models_own(graft_plugin, tmp_path: Path) -> None:
    run = trainer(tmp_path / "run")
    model = weights(run.engine.model)
    plugin = Declines()
    graft_plugin(plugin, name="declines")
    written = export(run, tmp_path / "hf")
    assert plugin.asked and all(set(names) == model.keys() for names in plugin.asked)
    assert written.keys() == model.keys()
    for name, tensor in written.items():
        assert torch.equal(tensor, model[name].to(tensor.dtype)), name
    copy = InferenceCopy(run.engine.model, dtype=torch.float32, device=torch.device("cpu"),
                         cfg=run.cfg)
    for name, param in copy.model.named_parameters():
        assert torch.equal(param, model[name]), name


@pytest.mark.parametrize("partial", [False, True], ids=["whole", "entry-left-out"])
def test_export_checkpoint_to_hf_rebuilds_what_a_checkpoint_left_out(
        graft_plugin, tmp_path: Path, partial: bool) -> None:
    if partial:
        graft_plugin(DropsFromCheckpoints(), name="drops-from-checkpoints")
    run = trainer(tmp_path / "run", "checkpoint.save_at_end=true")
    initial = weights(run.engine.model)
    run.fit()
    trained = weights(run.engine.model)
    ckpt = read_latest(tmp_path / "run")
    assert ckpt is not None
    assert export_checkpoint_to_hf(ckpt, tmp_path / "hf", dtype_name="auto") > 0
    written = load_file(tmp_path / "hf" / "model.safetensors")
    assert not torch.equal(trained[DROPPED], initial[DROPPED])  # the step changed it
    # an entry the checkpoint left out is rebuilt as the run built it (here: from the seed);
    # every other entry is the checkpoint's
    assert torch.equal(written[DROPPED], initial[DROPPED] if partial else trained[DROPPED])
    for name, value in trained.items():
        if name != DROPPED and name in written:
            assert torch.equal(written[name], value), name
