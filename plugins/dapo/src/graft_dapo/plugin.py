"""graft-dapo's hooks (no torch here: Graft imports this module for every command): its config
section (the old ``algorithm.*`` keys are moved keys, in the core's table), its rule, and the
shaper each RL step's batch goes through."""

from __future__ import annotations

from typing import Any

from graft import hookimpl
from graft_dapo.config import SECTION, DapoConfig, check_dapo, shaping_enabled


@hookimpl
def graft_config_sections() -> list[tuple[str, type]]:
    """``features.dapo`` (`DapoConfig`)."""
    return [(SECTION, DapoConfig)]


@hookimpl
def graft_config_rules() -> list[Any]:
    """Dynamic sampling needs groups; the overlong penalty's buffer fits the responses."""
    return [check_dapo]


@hookimpl
def graft_batch_shaper(cfg: Any, env: Any, eos_token_id: int | None) -> Any:
    """A `graft_dapo.DapoShaper` when ``features.dapo`` shapes anything; None (one draw, as it
    is) otherwise."""
    if not shaping_enabled(cfg):
        return None
    from graft_dapo.shaping import DapoShaper

    return DapoShaper(cfg, env, eos_token_id)
