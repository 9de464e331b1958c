"""Rules that tie config fields together, checked after composition (`ConfigError`, exit 2).

Each rule is a small function named for what it forbids; a value that would silently train
wrong (zero advantages, zero gradients) is an error here rather than a surprise later.

A default never conflicts with another setting: before the rules run, `adjust_defaults` moves a
default the user did not set to the value the rest of the config needs (and says so where it is
not obvious); only a value the user set can break a rule.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from typing import Any

from graft.errors import ConfigError
from graft.plugins import GraftPluginManager

logger = logging.getLogger("graft.config")


def was_set(key: str, user_keys: Collection[str]) -> bool:
    """True when the user gave ``key`` (dotted) a value in a config file or an override, itself
    or through a section above it; False when it holds the schema's default."""
    return key in user_keys or any(key.startswith(f"{k}.") for k in user_keys)


def gspo_default_has_no_dual_clip(cfg: Any, manager: GraftPluginManager,
                                  user_keys: Collection[str]) -> None:
    """``loss.policy_loss=gspo`` turns the default ``loss.clip_ratio_c`` off (GSPO has no dual
    clip); a value the user set stays and `gspo_has_no_dual_clip` refuses it."""
    if cfg.loss.policy_loss == "gspo" and not was_set("loss.clip_ratio_c", user_keys):
        cfg.loss.clip_ratio_c = None


def vllm_context_fits_the_model(cfg: Any, manager: GraftPluginManager,
                                user_keys: Collection[str]) -> None:
    """``rollout.max_model_len`` above the model's ``max_position_embeddings`` (vLLM refuses to
    start): the default is lowered to the model's limit, with a message; a value the user set is
    a `ConfigError` naming both numbers."""
    if cfg.trainer.mode != "rl" or cfg.rollout.engine != "vllm":
        return
    if cfg.model.path and _local_model_type(cfg.model.path) is None:
        return  # not on this machine: VLLMRollout checks it when the model is loaded
    from graft.inference.vllm_engine import context_length_problem
    from graft.models.build import resolve_config

    config, _ = resolve_config(cfg.model, manager)
    problem = context_length_problem(cfg.rollout.max_model_len, config)
    if problem is None:
        return
    if was_set("rollout.max_model_len", user_keys):
        raise ConfigError(problem)
    limit = config.max_position_embeddings
    logger.info("rollout.max_model_len: the default %d is above the model's "
                "max_position_embeddings; using %d", cfg.rollout.max_model_len, limit)
    cfg.rollout.max_model_len = limit


DEFAULTS: tuple[Callable[[Any, GraftPluginManager, Collection[str]], None], ...] = (
    gspo_default_has_no_dual_clip, vllm_context_fits_the_model)


def registered_rules(manager: GraftPluginManager) -> tuple[list[Callable[..., None]],
                                                            list[Callable[..., None]]]:
    """The ``graft_config_rules`` of every plugin: those that fit defaults (they declare
    ``user_keys``), then the checks."""
    import inspect

    rules = [rule for found in manager.hook.graft_config_rules() for rule in found or ()]
    fits = [r for r in rules if "user_keys" in inspect.signature(r).parameters]
    return fits, [r for r in rules if r not in fits]


def adjust_defaults(cfg: Any, manager: GraftPluginManager, user_keys: Collection[str]) -> None:
    """Fit the defaults the user left (every key not in ``user_keys``, dotted) to the settings
    around them, in place, before `validate_config` checks the rules."""
    from graft.plugins.keywords import call_with_keywords

    for adjust in DEFAULTS:
        adjust(cfg, manager, user_keys)
    for fit in registered_rules(manager)[0]:
        call_with_keywords(fit, cfg=cfg, manager=manager, user_keys=user_keys)


def group_estimator_needs_groups(cfg: Any, manager: GraftPluginManager) -> None:
    """``rollout.n`` below the estimator's group size gives every sample advantage 0."""
    if cfg.trainer.mode != "rl":
        return
    from graft.rl.advantages import advantage_estimators

    estimator = advantage_estimators(manager).get(cfg.algorithm.advantage)
    if estimator is not None and cfg.rollout.n < estimator.min_group_size:
        raise ConfigError(
            f"rollout.n={cfg.rollout.n} but algorithm.advantage={cfg.algorithm.advantage!r} "
            f"compares the samples of one prompt and needs rollout.n >= "
            f"{estimator.min_group_size} (with fewer every advantage is 0 and nothing is "
            f"learned); raise rollout.n")


def expert_parallel_needs_a_family(cfg: Any, manager: GraftPluginManager) -> None:
    """``engine.ep_size > 1`` only with a model family that implements expert parallelism
    (checked before any rank starts, so ``graft train --nproc N`` fails in one line)."""
    ep = cfg.engine.ep_size  # >= 1: a `bounded` field
    if ep == 1:
        return
    from graft.engine.parallelize import check_expert_parallel
    from graft.models.registry import family_for, model_families, preset

    if cfg.model.path:
        model_type = _local_model_type(cfg.model.path)
        if model_type is None:  # not on this machine (an example for a cluster): checked at load
            return
        family = family_for(model_type, manager)
    else:
        family = preset(cfg.model.preset, manager)[0]
    check_expert_parallel(family, ep, list(model_families(manager).values()))


def _local_model_type(path: str) -> str | None:
    """``model_type`` of a local model directory's config.json; None when there is no such
    directory here (loading the model reports that, with the fix)."""
    import json
    from pathlib import Path

    config = Path(path).expanduser() / "config.json"
    if not config.is_file():
        return None
    try:
        return json.loads(config.read_text())["model_type"]
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"model.path {path!r}: cannot read model_type from {config}: "
                          f"{exc}") from exc


def gspo_has_no_dual_clip(cfg: Any, manager: GraftPluginManager) -> None:
    """``loss.clip_ratio_c`` set with ``loss.policy_loss=gspo`` would be silently ignored (the
    default is turned off by `gspo_default_has_no_dual_clip`)."""
    from graft.losses.gspo import check_gspo_config

    check_gspo_config(cfg)


def exact_needs_what_it_can_serve(cfg: Any, manager: GraftPluginManager) -> None:
    """``rollout.exact`` with an engine, a compiler or a model family its kernels cannot serve
    (`graft.engine.exact.support`), refused before any rank starts."""
    if not cfg.rollout.exact:
        return
    from graft.engine.exact.support import check_exact_settings, check_exact_support
    from graft.models.build import resolve_config

    check_exact_settings(cfg)
    if cfg.model.path and _local_model_type(cfg.model.path) is None:
        return  # not on this machine: checked when the model is built
    config, family = resolve_config(cfg.model, manager)
    check_exact_support(config, family)


RULES: tuple[Callable[[Any, GraftPluginManager], None], ...] = (
    group_estimator_needs_groups, expert_parallel_needs_a_family, gspo_has_no_dual_clip,
    exact_needs_what_it_can_serve)


def validate_config(cfg: Any, manager: GraftPluginManager) -> None:
    """Run every rule on the composed config (the core's, then the plugins'
    ``graft_config_rules``); the first broken one raises `ConfigError`."""
    from graft.plugins.keywords import call_with_keywords

    for rule in RULES:
        rule(cfg, manager)
    for rule in registered_rules(manager)[1]:
        call_with_keywords(rule, cfg=cfg, manager=manager)
