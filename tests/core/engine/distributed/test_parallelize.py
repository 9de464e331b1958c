"""`parallelize` gives a family's own parallelize function the same plugin guarantees."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch

from graft import hookimpl
from graft.config import compose
from graft.engine.distributed.env import init_distributed
from graft.engine.distributed.parallelize import apply_pre_shard_hooks, parallelize
from graft.errors import PluginError
from graft.models.build import build_model


class RecordPreShard:
    """Records the device the model is on when ``graft_pre_shard`` runs."""

    def __init__(self) -> None:
        self.devices: list[torch.device] = []

    @hookimpl
    def graft_pre_shard(self, model: torch.nn.Module) -> None:
        self.devices.append(next(model.parameters()).device)


def custom_parallelize(model: torch.nn.Module, family: Any, *, cfg: Any, mesh: Any,
                       device: torch.device) -> torch.nn.Module:
    """An expert-parallel family would re-lay experts here; this one only runs the hooks."""
    apply_pre_shard_hooks(model, cfg=cfg, mesh=mesh)
    return model


def forgetful_parallelize(model: torch.nn.Module, family: Any, **_: Any) -> torch.nn.Module:
    return model


def run(parallelize_fn: Any) -> torch.nn.Module:
    env = init_distributed(device_preference="cpu")
    cfg = compose(["model.preset=tiny-llama", "engine.device=cpu"])
    model, family = build_model(cfg.model)
    family = replace(family, parallelize=parallelize_fn)
    return parallelize(model, family, cfg=cfg, mesh=env.mesh, device=env.device)


def test_a_custom_parallelize_runs_the_pre_shard_plugins_once(graft_plugin) -> None:
    recorder = RecordPreShard()
    graft_plugin(recorder, name="record-pre-shard")
    model = run(custom_parallelize)
    assert recorder.devices == [torch.device("cpu")]
    with pytest.raises(PluginError, match="twice"):
        apply_pre_shard_hooks(model, cfg=None, mesh=None)


def test_a_custom_parallelize_that_skips_the_hook_is_an_error() -> None:
    with pytest.raises(PluginError, match="'llama'.*forgetful_parallelize.*apply_pre_shard_hooks"):
        run(forgetful_parallelize)
