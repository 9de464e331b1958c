"""What ``features.lora.enabled=true`` does not combine with yet, refused before any rank
starts, each with the reason and what to set instead."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from graft.config import was_set
from graft.errors import ConfigError
from graft_lora.config import lora_section

ON = "features.lora.enabled=true"


def lora_fits_the_run(cfg: Any, user_keys: Collection[str]) -> None:
    """Refuse the settings adapters cannot serve (the rule of ``graft_config_rules``); under
    expert parallelism the default ``experts`` turns off (the user's ``engine.ep_size`` wins
    over a default), a ``features.lora.experts=true`` the user set is refused."""
    section = lora_section(cfg)
    if not section.enabled:
        return
    features = getattr(cfg, "features", None)
    if getattr(getattr(features, "exact", None), "enabled", False):
        raise ConfigError(f"{ON} with features.exact.enabled=true: the trainer computes "
                          f"W x + scale * B (A x) while the rollout decodes with the merged "
                          f"weight (W + scale * B A) x, which round differently, so the "
                          f"log-probs would not match bit for bit; set one of them to false")
    if section.experts and cfg.engine.ep_size > 1:
        if not was_set("features.lora.experts", user_keys):
            section.experts = False
            return
        raise ConfigError(f"{ON} with features.lora.experts=true and engine.ep_size > 1: expert "
                          f"adapters are not sharded over expert-parallel ranks yet; set "
                          f"features.lora.experts=false or engine.ep_size=1")
