"""The ``features.ulysses`` config section and the settings it cannot serve (no torch: imported
by every command)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from graft.config import bounded


@dataclass
class UlyssesConfig:
    """``features.ulysses``: split every row by sequence over ``sp_size`` ranks."""

    # Ranks each row is split over (the sp mesh dimension); must divide the world size and the
    # model's attention heads. 1: no sequence parallelism (the plugin installs nothing).
    sp_size: int = bounded(1, ge=1, note="1 turns sequence parallelism off")


def sp_size(cfg: Any) -> int:
    """``features.ulysses.sp_size`` of the root config (1 when the section is absent)."""
    section = getattr(getattr(cfg, "features", None), "ulysses", None)
    return int(getattr(section, "sp_size", 1)) if section is not None else 1


def run_conflict(cfg: Any) -> str | None:
    """Why this run's settings cannot be served with ``sp_size`` > 1, or None."""
    size = sp_size(cfg)
    # graft-multiturn's episodes
    environment = getattr(getattr(cfg.features, "multiturn", None), "environment", None)
    if cfg.trainer.mode == "rl" and environment not in (None, "", "none"):
        return (f"features.ulysses.sp_size={size} with features.multiturn.environment="
                f"{environment!r} is not supported: the sp ranks of one data shard must train "
                f"on one set of episodes and environments keep per-rank state; set "
                f"features.ulysses.sp_size=1 or drop the environment")
    if getattr(getattr(cfg.features, "exact", None), "enabled", False):  # graft-exact's
        return (f"features.ulysses.sp_size={size} with features.exact.enabled=true is not "
                f"supported: the exact kernels serve whole rows, not the all-to-all's head "
                f"shards; set features.ulysses.sp_size=1 or features.exact.enabled=false")
    if cfg.engine.ep_size > 1:
        return (f"features.ulysses.sp_size={size} with engine.ep_size={cfg.engine.ep_size} is not "
                f"supported yet; set one of them to 1")
    return None
