"""The core's rollout engines, registered as a built-in plugin (``graft_rollout_engines``), and
building the engine ``rollout.engine`` names from the registry (core and plugins).

Kept free of torch imports at module level: the plugin manager loads it for every command.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from graft.hookspecs import hookimpl
from graft.plugins import GraftPluginManager, get_plugin_manager
from graft.plugins.keywords import call_with_keywords
from graft.plugins.registry import collect_named, registry_names

if TYPE_CHECKING:
    from graft.config.schema import GraftConfig
    from graft.rollout.types import RolloutEngine


def build_embedded(*, cfg: GraftConfig, engine: Any, env: Any, tokenizer: Any) -> Any:
    """The trained model itself generates (batched HF generation with a KV cache), as the root
    config ``cfg`` says (``rollout``, ``engine``; the plugins' hooks get all of it)."""
    from graft.rollout.embedded import EmbeddedRollout

    static = cfg.rollout.decode == "static"
    return EmbeddedRollout(engine.model, pad_token_id=tokenizer.pad_token_id,
                           eos_token_id=tokenizer.eos_token_id, device=env.device,
                           reshard_blocks=cfg.engine.reshard_after_forward,
                           static_copy_dtype=engine.compute_dtype if static else None,
                           logits_dtype=engine.compute_dtype,
                           compile_backend=cfg.rollout.decode_compile,
                           left_padding_exact=engine.family.left_padding_exact, cfg=cfg,
                           group=env.group)


@hookimpl
def graft_rollout_engines() -> dict[str, Any]:
    """``embedded`` (graft-vllm adds ``vllm``)."""
    return {"embedded": build_embedded}


@hookimpl
def graft_config_choices() -> dict[str, Any]:
    """``rollout_engines`` and ``environments`` (the hook contract's registry, which
    graft-multiturn's ``features.multiturn.environment`` names)."""
    return {"rollout_engines": registry_names("graft_rollout_engines", "rollout engine"),
            "environments": registry_names("graft_environments", "environment")}


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
