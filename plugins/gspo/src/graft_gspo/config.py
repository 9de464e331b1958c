"""The ``features.gspo`` config section and GSPO's config rules (no torch: imported by every
command)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from graft.config import bounded, choice, was_set
from graft.errors import ConfigError

SECTION = "gspo"
NAME = "gspo"  # the policy loss's name, ``loss.policy_loss=gspo``


@dataclass
class GspoConfig:
    """``features.gspo``: GSPO's rollout importance weights (until graft-gspo, the core's
    ``loss.gspo_rollout_is`` and ``loss.gspo_rollout_is_cap``). The loss itself is selected
    with ``loss.policy_loss=gspo`` and clipped with ``loss.clip_ratio_low/high``."""

    # GSPO (policy_loss=gspo): rollout importance weights min(exp(old - rollout), cap) per token,
    # or per sequence (the geometric mean over its tokens, like GSPO's ratio); none: off.
    rollout_is: str = choice("none", ("none", "token", "sequence"))
    # Their truncation (the largest weight).
    rollout_is_cap: float = bounded(2.0, gt=0.0)


def gspo_section(cfg: Any) -> GspoConfig:
    """``cfg.features.gspo`` of ``cfg`` (the root config), or the defaults (no rollout weights)
    for a config composed without this plugin's section."""
    section = getattr(getattr(cfg, "features", None), SECTION, None)
    return GspoConfig() if section is None else section


def gspo_default_has_no_dual_clip(cfg: Any, user_keys: Collection[str]) -> None:
    """A config rule that fits a default (``graft_config_rules``, it declares ``user_keys``):
    ``loss.policy_loss=gspo`` turns the default ``loss.clip_ratio_c`` off (GSPO has no dual
    clip); a value the user set stays and `check_gspo_config` refuses it."""
    if cfg.loss.policy_loss == NAME and not was_set("loss.clip_ratio_c", user_keys):
        cfg.loss.clip_ratio_c = None


def check_gspo_config(cfg: Any) -> None:
    """A config rule (``graft_config_rules``), `ConfigError` for:

    - ``loss.policy_loss=gspo`` with ``loss.clip_ratio_c`` set: GSPO (as in verl) has no dual
      clip, so the setting would be silently ignored;
    - ``features.gspo.rollout_is`` with another policy loss, which would ignore it;
    - ``features.gspo.rollout_is`` with ``algorithm.rollout_correction``: the loss would be
      weighted by the rollout's importance ratio twice.
    """
    loss, gspo = cfg.loss, gspo_section(cfg)
    if loss.policy_loss == NAME and loss.clip_ratio_c is not None:
        raise ConfigError(f"loss.policy_loss=gspo has no dual clip, so loss.clip_ratio_c="
                          f"{loss.clip_ratio_c} would be ignored (GSPO clips its sequence ratio "
                          f"to [1 - clip_ratio_low, 1 + clip_ratio_high] only, as verl's GSPO "
                          f"does); set loss.clip_ratio_c=null")
    if gspo.rollout_is == "none":
        return
    if loss.policy_loss != NAME:
        raise ConfigError(f"features.gspo.rollout_is={gspo.rollout_is} weights GSPO's loss, but "
                          f"loss.policy_loss={loss.policy_loss} would ignore it; set "
                          f"loss.policy_loss=gspo or features.gspo.rollout_is=none")
    correction = cfg.algorithm.rollout_correction
    if correction != "none":
        raise ConfigError(f"algorithm.rollout_correction={correction} and "
                          f"features.gspo.rollout_is={gspo.rollout_is} both weight the loss by "
                          f"the rollout's importance ratio; set one of them to none")
