"""The ``features.dapo`` config section and its rule (no torch: imported by every command)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from graft.config import bounded, choice
from graft.errors import ConfigError

SECTION = "dapo"


@dataclass
class DapoConfig:
    """``features.dapo``: DAPO's shaping of each RL step's batch (until graft-dapo, the core's
    ``algorithm.dynamic_sampling``, ``max_sampling_rounds``, ``overlong``, ``overlong_buffer``
    and ``overlong_penalty``)."""

    # DAPO dynamic sampling: drop the groups (a prompt's rollout.n samples) whose rewards are
    # all equal (zero advantage) and, colocated, draw and generate rollout.prompts_per_step
    # more prompts until that many groups are kept over all ranks; the first kept, in draw
    # order, are trained. Metrics under dynamic_sampling/.
    dynamic_sampling: bool = False
    # Generation rounds per step at most (the first included); when they keep fewer groups
    # than rollout.prompts_per_step the step trains on those (padded with dropped groups, loss
    # mask 0, to a multiple of the data-parallel size).
    max_sampling_rounds: int = bounded(4, ge=1)
    # Truncated responses (no eos within rollout.max_new_tokens): none; filter = loss mask 0
    # (their reward stays in the group's baseline); penalty = DAPO's soft overlong punishment
    # added to the reward. Metrics under overlong/.
    overlong: str = choice("none", ("none", "filter", "penalty"))
    # penalty: the last overlong_buffer tokens before rollout.max_new_tokens, over which the
    # penalty falls linearly from 0 to -overlong_penalty (tokens; null = a fifth of
    # rollout.max_new_tokens, at least 1).
    overlong_buffer: int | None = bounded(None, ge=1)
    overlong_penalty: float = bounded(1.0, ge=0.0)


def dapo_section(cfg: Any) -> DapoConfig:
    """``cfg.features.dapo`` of ``cfg`` (the root config), or the defaults (nothing shaped) for
    a config composed without this plugin's section."""
    section = getattr(getattr(cfg, "features", None), SECTION, None)
    return DapoConfig() if section is None else section


def shaping_enabled(cfg: Any) -> bool:
    """Whether ``features.dapo`` shapes anything (dynamic sampling or an overlong mode)."""
    dapo = dapo_section(cfg)
    return bool(dapo.dynamic_sampling) or dapo.overlong != "none"


def check_dapo(*, cfg: Any) -> None:
    """A config rule (``graft_config_rules``): dynamic sampling needs groups
    (``rollout.n >= 2``: a lone sample's group is always flat), and the overlong penalty's
    buffer must fit in ``rollout.max_new_tokens`` (`ConfigError`)."""
    dapo, rollout = dapo_section(cfg), cfg.rollout
    if cfg.trainer.mode != "rl":
        return
    if dapo.dynamic_sampling and rollout.n < 2:
        raise ConfigError(f"features.dapo.dynamic_sampling=true drops the prompts whose "
                          f"rollout.n samples all score the same; with rollout.n={rollout.n} "
                          f"every prompt would be dropped: raise rollout.n to 2 or more")
    buffer = dapo.overlong_buffer
    if dapo.overlong == "penalty" and buffer is not None and buffer > rollout.max_new_tokens:
        raise ConfigError(f"features.dapo.overlong_buffer={buffer} is longer than "
                          f"rollout.max_new_tokens={rollout.max_new_tokens}: the penalty would "
                          f"start before the response does; lower it")
