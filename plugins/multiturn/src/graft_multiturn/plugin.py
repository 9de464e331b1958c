"""graft-multiturn's hooks (no torch here: Graft imports this module for every command): its
config section (its ``environment`` names one of the core's ``environments`` registry,
``graft_environments``), and the episode runner that turns an RL step's prompts into
episodes."""

from __future__ import annotations

from typing import Any

from graft import hookimpl
from graft_multiturn.config import MultiturnConfig

SECTION = "multiturn"


@hookimpl
def graft_config_sections() -> list[tuple[str, type]]:
    """``features.multiturn`` (`MultiturnConfig`)."""
    return [(SECTION, MultiturnConfig)]


@hookimpl
def graft_episode_runner(cfg: Any, tokenizer: Any, env: Any) -> Any:
    """The `graft_multiturn.EpisodeRunner` of ``features.multiturn.environment``; None (one
    response per prompt) for ``none``."""
    from graft_multiturn.runner import build_episode_runner

    return build_episode_runner(cfg=cfg, tokenizer=tokenizer, env=env)
