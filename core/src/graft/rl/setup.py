"""Building what an RL run needs besides the trained engine: the rollout engine, the reference."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from graft.engine.distributed import DistEnv
from graft.engine.parallelize import parallelize
from graft.engine.train_engine import TrainEngine
from graft.models.build import build_model


def build_rollout(cfg: Any, engine: TrainEngine, env: DistEnv, run_dir: Path,
                  tokenizer: Any) -> Any:
    """``rollout.engine``: the trained model itself, or a vLLM engine fed after each step."""
    if cfg.rollout.engine == "vllm":
        from graft.rollout.vllm import VLLMRollout

        return VLLMRollout(engine.model, compute_dtype=engine.compute_dtype, cfg=cfg, env=env,
                           run_dir=run_dir, tokenizer=tokenizer)
    from graft.rollout.embedded import EmbeddedRollout

    return EmbeddedRollout(engine.model, pad_token_id=tokenizer.pad_token_id,
                           eos_token_id=tokenizer.eos_token_id, device=env.device,
                           reshard_blocks=cfg.engine.reshard_after_forward)


def build_reference(cfg: Any, env: DistEnv, engine: TrainEngine) -> TrainEngine:
    """A frozen copy of the initial policy (same seed, or the same checkpoint directory),
    sharded like the policy, for the KL penalty; it has no optimizer."""
    model, family = build_model(cfg.model, seed=cfg.trainer.seed, device=env.device)
    model.requires_grad_(False)
    model = parallelize(model, family, cfg=cfg, mesh=env.mesh, device=env.device)
    return TrainEngine(model, family, None, None, env, cfg, engine.compute_dtype,
                       engine.pad_token_id)
