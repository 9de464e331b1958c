"""Building what an RL run needs besides the trained engine and its rollout: the reference."""

from __future__ import annotations

from typing import TYPE_CHECKING

from graft.engine.distributed.env import DistEnv
from graft.engine.distributed.parallelize import build_parallel_model
from graft.engine.train_engine import TrainEngine

if TYPE_CHECKING:
    from graft.config.schema import GraftConfig


def build_reference(env: DistEnv, engine: TrainEngine, *, cfg: GraftConfig) -> TrainEngine:
    """A frozen copy of the initial policy (same seed, or the same checkpoint directory),
    sharded like the policy (``graft_pre_shard`` sees ``role="reference"``), for the KL
    penalty; it has no optimizer. ``cfg`` is the root config, as for the policy."""
    model, family = build_parallel_model(env, cfg=cfg, role="reference")
    return TrainEngine(model, family, None, None, env, cfg, engine.compute_dtype,
                       engine.pad_token_id)
