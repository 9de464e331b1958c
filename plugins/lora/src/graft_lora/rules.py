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
    """Refuse the settings adapters cannot serve (the rule of ``graft_config_rules``)."""
    section = lora_section(cfg)
    if not section.enabled:
        return
    features = getattr(cfg, "features", None)
    if getattr(getattr(features, "exact", None), "enabled", False):
        exact_decodes_unmerged(section, user_keys)


def exact_decodes_unmerged(section: Any, user_keys: Collection[str]) -> None:
    """Under ``features.exact`` the rollout must compute what the trainer does, ``W x + scale *
    B (A x)``: the default ``engine_sync`` becomes ``adapter`` (the decode copy applies the
    adapters unmerged); a ``merged`` the user set is refused."""
    if section.engine_sync == "adapter":
        return
    if not was_set("features.lora.engine_sync", user_keys):
        section.engine_sync = "adapter"
        return
    raise ConfigError(f"{ON} with features.exact.enabled=true and features.lora.engine_sync="
                      f"{section.engine_sync}: the trainer computes W x + scale * B (A x) while "
                      f"the rollout would decode with the merged weight (W + scale * B A) x, "
                      f"which rounds differently, so the log-probs would not match bit for bit; "
                      f"set features.lora.engine_sync=adapter (the decode copy then applies the "
                      f"adapters unmerged, as the trainer does)")
