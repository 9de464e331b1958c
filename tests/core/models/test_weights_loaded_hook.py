"""``graft_weights_loaded``: a run on ``model.path`` whose plugin added a parameter in
``graft_pre_shard`` (an adapter, say) has the checkpoint's weights read in and the plugin's
parameter filled by the plugin; a parameter no plugin fills, or a checkpoint weight the built
model lacks, is a `ConfigError` naming it. The core alone: test plugins, a Hugging Face directory
saved from the tiny-llama preset (``save_pretrained``), the run's real build on CPU."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from torch.distributed.tensor import DTensor, distribute_tensor

from graft import hookimpl
from graft.config import compose
from graft.errors import ConfigError
from graft.testing.checkpoint import save_tiny_checkpoint
from graft.training.trainer import Trainer

EXTRA = "model.extra"  # the parameter the plugin adds to the decoder (``model.model``)
SEED = 3
NORM = "model.layers.0.post_attention_layernorm.weight"  # a weight `DropsANorm` leaves out


class AddsExtra:
    """Adds ``EXTRA`` before sharding (on meta on a ``model.path`` build, like an adapter)."""

    @hookimpl
    def graft_pre_shard(self, model: torch.nn.Module, role: str) -> None:
        if role == "policy":
            device = next(model.parameters()).device
            model.model.register_parameter("extra", torch.nn.Parameter(torch.empty(8, device=device)))


def extra_value(seed: int) -> torch.Tensor:
    return torch.randn(8, generator=torch.Generator().manual_seed(seed)) + 10


class FillsExtra(AddsExtra):
    """`AddsExtra`, and fills ``EXTRA`` after the load from the seed it is given."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], int]] = []

    @hookimpl
    def graft_weights_loaded(self, model: torch.nn.Module, missing: list[str],
                             seed: int) -> list[str]:
        self.calls.append((list(missing), seed))
        if EXTRA not in missing:
            return []
        param = model.get_parameter(EXTRA)
        value = extra_value(seed).to(param.device, param.dtype)
        if isinstance(param, DTensor):
            value = distribute_tensor(value, param.device_mesh, param.placements)
        with torch.no_grad():
            param.copy_(value)
        return [EXTRA]


class ClaimsNothing:
    """Answers ``graft_weights_loaded`` without claiming anything (records what it was told)."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], int]] = []

    @hookimpl
    def graft_weights_loaded(self, missing: list[str], seed: int) -> list[str]:
        self.calls.append((list(missing), seed))
        return []


class DropsANorm:
    """Replaces layer 0's post-attention norm (which the checkpoint has a weight for)."""

    @hookimpl
    def graft_pre_shard(self, model: torch.nn.Module, role: str) -> None:
        model.model.layers[0].post_attention_layernorm = torch.nn.Identity()


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_checkpoint("tiny-llama", tmp_path_factory.mktemp("hf") / "tiny-llama")


def build(hf_dir: Path, run_dir: Path) -> Trainer:
    return Trainer(compose([f"trainer.run_dir={run_dir}", f"model.path={hf_dir}",
                            f"trainer.seed={SEED}", "engine.device=cpu", "trainer.mode=sft",
                            "trainer.total_steps=1", "checkpoint.every_steps=0",
                            "checkpoint.save_at_end=false", "export.hf_at_end=false"]))


def full(param: Any) -> torch.Tensor:
    return param.full_tensor() if isinstance(param, DTensor) else param.detach()


@pytest.mark.parametrize("bystander", [False, True], ids=["no-implementation", "claims-nothing"])
def test_a_parameter_the_checkpoint_lacks_and_no_plugin_fills_is_a_config_error(
        graft_plugin, hf_dir: Path, tmp_path: Path, bystander: bool) -> None:
    graft_plugin(AddsExtra(), name="adds-extra")
    if bystander:
        watcher = ClaimsNothing()
        graft_plugin(watcher, name="claims-nothing")
    with pytest.raises(ConfigError, match=re.escape(f"no weights for {EXTRA}, and no plugin")):
        build(hf_dir, tmp_path)
    if bystander:  # asked, with only the plugin's parameter missing
        assert watcher.calls == [([EXTRA], SEED)]


def test_hook_graft_weights_loaded_fills_the_plugins_parameter(graft_plugin, hf_dir: Path,
                                                               tmp_path: Path) -> None:
    plugin = FillsExtra()
    graft_plugin(plugin, name="fills-extra")
    model = build(hf_dir, tmp_path).engine.model
    assert plugin.calls == [([EXTRA], SEED)]  # once, only its own parameter, trainer.seed
    params = dict(model.named_parameters())
    assert torch.equal(full(params.pop(EXTRA)), extra_value(SEED))
    saved = load_file(hf_dir / "model.safetensors")
    assert saved.keys() == params.keys()
    for name, value in params.items():  # the base weights are the checkpoint's
        assert torch.equal(full(value), saved[name].to(value.dtype)), name


def test_a_checkpoint_weight_the_built_model_lacks_is_a_config_error(
        graft_plugin, hf_dir: Path, tmp_path: Path) -> None:
    graft_plugin(DropsANorm(), name="drops-a-norm")
    with pytest.raises(ConfigError, match=re.escape(f"model built from its config lacks ({NORM})")):
        build(hf_dir, tmp_path)
