"""Checks of a composed config: the rules that tie its fields together (`ConfigError`, exit 2),
and ``graft train``'s pre-flight of the files it names.

The rules are small functions named for what they forbid, registered by the package or plugin
that owns the settings (``graft_config_rules``: `graft.losses.builtin`, `graft.rl.builtin`,
`graft.training.builtin`...); a value that would silently train wrong (zero advantages, zero
gradients) is an error here rather than a surprise later.

A default never conflicts with another setting: before the checks run, the rules that take
``user_keys`` move a default the user did not set to the value the rest of the config needs
(and say so where it is not obvious); only a value the user set can break a rule.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection
from typing import Any

from graft.config.hooks import PluginManager, call_declared, each_result, plugin_manager


def registered_rules(manager: PluginManager) -> tuple[list[Callable[..., None]],
                                                       list[Callable[..., None]]]:
    """The ``graft_config_rules`` of every plugin, the core's packages first: those that fit
    defaults (they declare ``user_keys``), then the checks."""
    rules = [rule for _, found in each_result(manager, "graft_config_rules")
             for rule in found or ()]
    fits = [r for r in rules if "user_keys" in inspect.signature(r).parameters]
    return fits, [r for r in rules if r not in fits]


def adjust_defaults(cfg: Any, manager: PluginManager, user_keys: Collection[str]) -> None:
    """Fit the defaults the user left (every key not in ``user_keys``, dotted) to the settings
    around them, in place, before `validate_config` checks the rules."""
    for fit in registered_rules(manager)[0]:
        call_declared(fit, cfg=cfg, manager=manager, user_keys=user_keys)


def validate_config(cfg: Any, manager: PluginManager) -> None:
    """Run every rule on the composed config (the ``graft_config_rules`` of the core's packages,
    then of the plugins); the first broken one raises `ConfigError`."""
    for rule in registered_rules(manager)[1]:
        call_declared(rule, cfg=cfg, manager=manager)


def preflight(cfg: Any, manager: PluginManager | None = None) -> None:
    """Raise the `graft.errors.GraftError` that loading ``cfg``'s files on this machine would
    raise (every ``graft_preflight``: the model directory and weights, tokenizer files, dataset
    files, a writable run directory); ``graft train`` calls it before any rank starts."""
    plugin_manager(manager).hook.graft_preflight(cfg=cfg)
