"""graft-gspo's hooks (no torch here: Graft imports this module for every command): its config
section (the old ``loss.gspo_rollout_is*`` keys are moved keys, in the core's table), its
rules, and the policy loss ``gspo``."""

from __future__ import annotations

from typing import Any

from graft import hookimpl
from graft_gspo.config import (
    NAME,
    SECTION,
    GspoConfig,
    check_gspo_config,
    gspo_default_has_no_dual_clip,
)


@hookimpl
def graft_config_sections() -> list[tuple[str, type]]:
    """``features.gspo`` (`GspoConfig`)."""
    return [(SECTION, GspoConfig)]


@hookimpl
def graft_config_rules() -> list[Any]:
    """GSPO has no dual clip: its default ``loss.clip_ratio_c`` is turned off, a value the user
    set is refused; the rollout weights need GSPO and no second rollout correction."""
    return [gspo_default_has_no_dual_clip, check_gspo_config]


@hookimpl
def graft_policy_losses() -> dict[str, Any]:
    """``gspo`` (`graft_gspo.gspo_loss`: the sequence ratio, clipped; not token-separable)."""
    from graft_gspo.loss import gspo_loss

    return {NAME: gspo_loss}
