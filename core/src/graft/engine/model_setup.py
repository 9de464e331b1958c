"""The trained (or reference) model of a run: built, parallelized over the run's meshes, filled.

A preset is initialised from the seed on every rank's device (same seed, same weights). A local
checkpoint (``model.path``) is built with meta parameters, sharded, and filled from one read of
the checkpoint on rank 0 broadcast parameter by parameter, so a run of N ranks holds one copy of
the model in host memory, not N.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from graft.engine.distributed import DistEnv
from graft.engine.parallelize import parallelize
from graft.models.build import build_empty_model, build_model, load_pretrained_weights
from graft.models.family import ModelFamily

if TYPE_CHECKING:
    from graft.config.schema import GraftConfig


def build_parallel_model(env: DistEnv, *, cfg: GraftConfig, role: str = "policy"
                         ) -> tuple[torch.nn.Module, ModelFamily]:
    """``cfg.model`` built (from ``cfg.trainer.seed``) and parallelized (``role``: ``policy`` or
    ``reference``, which gets no gradients); returns the sharded model and its family. ``cfg``
    is the root config: `parallelize` passes it on to the plugins."""
    if cfg.model.path:
        model, family = build_empty_model(cfg.model)
    else:
        model, family = build_model(cfg.model, seed=cfg.trainer.seed, device=env.device)
    if role == "reference":
        model.requires_grad_(False)
    model = parallelize(model, family, cfg=cfg, mesh=env.mesh, device=env.device, role=role,
                        meshes=env.meshes)
    if cfg.model.path:
        load_pretrained_weights(model, cfg.model, is_main=env.is_main)
    return model, family
