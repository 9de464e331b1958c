"""Building what an RL run needs besides the trained engine and its rollout: the reference."""

from __future__ import annotations

from typing import Any

from graft.engine.distributed import DistEnv
from graft.engine.model_setup import build_parallel_model
from graft.engine.train_engine import TrainEngine


def build_reference(cfg: Any, env: DistEnv, engine: TrainEngine) -> TrainEngine:
    """A frozen copy of the initial policy (same seed, or the same checkpoint directory),
    sharded like the policy (``graft_pre_shard`` sees ``role="reference"``), for the KL
    penalty; it has no optimizer."""
    model, family = build_parallel_model(cfg, env, role="reference")
    return TrainEngine(model, family, None, None, env, cfg, engine.compute_dtype,
                       engine.pad_token_id)
