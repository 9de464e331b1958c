"""The one calling convention of every registry: keyword arguments, each function gets only the
ones it declares.

Hooks get this from pluggy; the functions plugins hand over through registries (policy losses,
rewards, advantage estimators, rollout engines, environments, trainer modes, a model family's
``parallelize``) get it here, so the core can pass new keywords without breaking functions
written before them. `REGISTRY_CALLS` says which keywords each registry passes; a function that
needs another (a parameter without a default that is not one of them, or a positional-only one)
is refused when its plugin registers, with a `PluginError` naming the plugin, the entry, the
function and the keywords it may take (`check_signature`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from graft.errors import PluginError


@dataclass(frozen=True)
class RegistryCall:
    """How the core calls the functions of one registry.

    ``kind`` names an entry in messages ("reward"); ``keywords`` are the keyword arguments every
    call offers; ``attribute`` is where the function sits on an entry that is an object rather
    than the function itself (`graft.rl.AdvantageEstimator.compute`, a family's
    ``parallelize``; a value of None there means "none", e.g. the core's own parallelize).
    """

    kind: str
    keywords: tuple[str, ...]
    attribute: str | None = None

    def function_of(self, entry: Any) -> Callable[..., Any] | None:
        """The function the core will call for ``entry`` (None: the entry has none)."""
        if self.attribute is not None and hasattr(entry, self.attribute):
            return getattr(entry, self.attribute)
        return entry if callable(entry) else None


# hook name -> its registry's calling convention (the hook specs document the same keywords).
REGISTRY_CALLS: dict[str, RegistryCall] = {
    "graft_policy_losses": RegistryCall(
        "policy loss", ("logp", "old_logp", "advantages", "mask", "cfg", "root_cfg", "tensors")),
    "graft_reward_functions": RegistryCall("reward", ("response", "sample", "cfg"),
                                           attribute="fn"),
    "graft_advantage_estimators": RegistryCall("advantage estimator",
                                               ("rewards", "group_size", "cfg"),
                                               attribute="compute"),
    "graft_rollout_corrections": RegistryCall(
        "rollout correction", ("old_logp", "rollout_logp", "mask", "cfg", "root_cfg")),
    "graft_rollout_engines": RegistryCall("rollout engine",
                                          ("cfg", "engine", "env", "run_dir", "tokenizer")),
    "graft_trainer_modes": RegistryCall("trainer mode", ("cfg", "tokenizer", "env")),
    "graft_environments": RegistryCall("environment", ("cfg", "tokenizer")),
    "graft_export_formats": RegistryCall("export format", ("model", "out_dir", "cfg")),
    "graft_model_families": RegistryCall(
        "model family", ("model", "family", "cfg", "mesh", "device", "role", "meshes"),
        attribute="parallelize"),
}


def accepted_keywords(fn: Callable[..., Any], offered: dict[str, Any]) -> dict[str, Any]:
    """The entries of ``offered`` that ``fn`` declares (all of them if it takes ``**kwargs``)."""
    parameters = inspect.signature(fn).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return dict(offered)
    names = {p.name for p in parameters
             if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)}
    return {k: v for k, v in offered.items() if k in names}


def call_with_keywords(fn: Callable[..., Any], **offered: Any) -> Any:
    """``fn(**kw)`` where ``kw`` holds only the ``offered`` keywords ``fn`` declares."""
    return fn(**accepted_keywords(fn, offered))


def unmet_parameters(fn: Callable[..., Any], keywords: tuple[str, ...]) -> list[str]:
    """The parameters of ``fn`` a call with (a subset of) ``keywords`` cannot fill: those
    without a default that are positional-only or not among ``keywords``."""
    unmet = []
    for param in inspect.signature(fn).parameters.values():
        if param.default is not inspect.Parameter.empty or param.kind in (
                inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            continue
        if param.kind is inspect.Parameter.POSITIONAL_ONLY or param.name not in keywords:
            unmet.append(param.name)
    return unmet


def check_signature(call: RegistryCall, entry: Any, *, name: str, plugin: str) -> None:
    """Refuse an entry whose function a call by ``call``'s convention would fail on."""
    fn = call.function_of(entry)
    if fn is None:
        return
    label = getattr(fn, "__qualname__", None) or repr(fn)
    try:
        unmet = unmet_parameters(fn, call.keywords)
    except (TypeError, ValueError) as exc:  # a builtin or C function without a signature
        raise PluginError(f"plugin {plugin!r}: the {call.kind} {name!r} ({label}) has no "
                          f"signature Graft can read ({exc}); wrap it in a Python function "
                          f"taking keywords from: {', '.join(call.keywords)}") from exc
    if unmet:
        raise PluginError(
            f"plugin {plugin!r}: the {call.kind} {name!r} is {label}{inspect.signature(fn)}, "
            f"which cannot be called: Graft calls every {call.kind} with keyword arguments "
            f"only, from {', '.join(call.keywords)} (a function takes any of them it names), "
            f"and nothing fills {', '.join(map(repr, unmet))}. Rename the parameter to one of "
            f"those keywords or give it a default.")
