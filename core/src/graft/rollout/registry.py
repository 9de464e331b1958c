"""The rollout-engine registry (core and plugins) and building the configured engine."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from graft.plugins import GraftPluginManager, get_plugin_manager
from graft.plugins.keywords import call_with_keywords
from graft.plugins.registry import collect_named
from graft.rollout.types import RolloutEngine

if TYPE_CHECKING:
    from graft.config.schema import GraftConfig


def rollout_engines(manager: GraftPluginManager | None = None) -> dict[str, Callable[..., Any]]:
    """Every rollout-engine factory by name; two providers of one name is a `PluginError`."""
    return collect_named(manager or get_plugin_manager(), "graft_rollout_engines",
                         "rollout engine")


def build_rollout(*, cfg: GraftConfig, engine: Any, env: Any, run_dir: Path,
                  tokenizer: Any) -> RolloutEngine:
    """The engine ``cfg.rollout.engine`` names, built by its factory (with the keywords it
    takes; ``cfg``, the root config, is passed on whole)."""
    factory = rollout_engines()[cfg.rollout.engine]
    return call_with_keywords(factory, cfg=cfg, engine=engine, env=env, run_dir=run_dir,
                              tokenizer=tokenizer)

