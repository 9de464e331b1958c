"""The ``features.router_replay`` config section: which routing replay runs, if any."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from graft.config import choice

DISABLED, R2, R3 = "disabled", "R2", "R3"
MODES = (DISABLED, R2, R3)


@dataclass
class RouterReplayConfig:
    """``features.router_replay``: record MoE routing in one pass and force it in later ones."""

    # disabled: native routing everywhere. R2: the trainer's old-log-prob pass records, every
    # update pass replays. R3: the rollout records (embedded engine: router hooks; vllm: its
    # routed experts), every trainer pass of the policy replays (old log-probs included).
    mode: str = choice(DISABLED, MODES)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"features.router_replay.mode is {self.mode!r}; use one of "
                             f"{', '.join(MODES)}")


def replay_mode(cfg: Any) -> str:
    """The configured mode; ``disabled`` for a config composed without this plugin's section."""
    section = getattr(getattr(cfg, "features", None), "router_replay", None)
    return DISABLED if section is None else section.mode


def run_conflict(cfg: Any, mode: str) -> str | None:
    """Why a run configured as ``cfg`` cannot use ``mode``, or None when it can."""
    if cfg.trainer.mode == "sft":
        return (f"features.router_replay.mode={mode} replays routing in RL steps; trainer.mode=sft "
                f"has no rollout or old-log-prob pass to record it. Set "
                f"features.router_replay.mode=disabled")
    rollout = cfg.rollout
    if mode == R3 and rollout.engine == "embedded" and getattr(rollout, "decode", "") == "static":
        return ("features.router_replay.mode=R3 records routing with hooks on the generating "
                "model, and rollout.decode=static generates with a separate compiled copy whose "
                "routers it cannot hook. Use rollout.decode=dynamic, or mode=R2")
    # graft-multiturn's episodes
    environment = getattr(getattr(cfg.features, "multiturn", None), "environment", "none")
    if mode == R3 and environment != "none":
        return (f"features.router_replay.mode=R3 records the routing of one generation per "
                f"sample; features.multiturn.environment={environment!r} generates an episode "
                f"in several turns with the environment's tokens between them. Use mode=R2 "
                f"(recorded by the trainer on the episode's ids), or "
                f"features.multiturn.environment=none")
    return None
