"""Checking a plugin's hook implementations against the specs, with messages a plugin author can act on.

pluggy checks argument names only when a hook has a spec, says little about what to do, and
silently ignores a misspelled hook until ``check_pending()``. These checks run before a plugin is
registered, so a broken plugin is reported (and isolated) instead of half-registered.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from types import ModuleType
from typing import Any

from graft import hookspecs
from graft.errors import PluginError, did_you_mean

_IMPL_MARKER = f"{hookspecs.PROJECT_NAME}_impl"
_SPEC_MARKER = f"{hookspecs.PROJECT_NAME}_spec"
# Hooks whose one plain implementation is the core's own step: plugins only wrap them.
WRAPPER_ONLY = frozenset({"graft_compute"})


def hook_specs(spec_module: ModuleType = hookspecs) -> dict[str, Callable[..., Any]]:
    """Return the hook specs of ``spec_module`` by name."""
    return {
        name: obj
        for name, obj in vars(spec_module).items()
        if callable(obj) and hasattr(obj, _SPEC_MARKER)
    }


def hook_impls(plugin: object) -> dict[str, Callable[..., Any]]:
    """Return the functions of ``plugin`` marked with `graft.hookimpl`, by hook name."""
    impls = {}
    for attr in dir(plugin):
        obj = getattr(plugin, attr, None)
        options = getattr(obj, _IMPL_MARKER, None)
        if callable(obj) and options is not None:
            impls[options.get("specname") or attr] = obj
    return impls


def signature_text(name: str, func: Callable[..., Any]) -> str:
    """Render ``name(arg, ...)`` for messages."""
    return f"{name}({', '.join(inspect.signature(func).parameters)})"


def verify_plugin(plugin: object, plugin_name: str) -> list[str]:
    """Check every hook implementation of ``plugin``; return the names of the hooks it implements.

    Raises `PluginError` naming the plugin, the hook and the fix when: a hookimpl matches no spec
    (a misspelling); a function is named like a hook but lacks ``@graft.hookimpl``; an
    implementation takes an argument the spec does not provide, or ``*args``/``**kwargs``; or a
    hook of `WRAPPER_ONLY` is implemented other than as a wrapper.
    """
    specs = hook_specs()
    impls = hook_impls(plugin)
    for hook_name, func in impls.items():
        if hook_name not in specs:
            raise PluginError(
                f"plugin {plugin_name!r}: the hookimpl {hook_name!r} matches no Graft hook "
                f"spec.{did_you_mean(hook_name, specs)} Known hooks: {', '.join(sorted(specs))}."
            )
        _verify_arguments(plugin_name, hook_name, func, specs[hook_name])
        if hook_name in WRAPPER_ONLY and not getattr(func, _IMPL_MARKER).get("wrapper"):
            raise PluginError(
                f"plugin {plugin_name!r}: {hook_name} wraps a step the core runs; declare it "
                f"@graft.hookimpl(wrapper=True), a generator that returns (yield)."
            )
    _verify_no_unmarked_hooks(plugin, plugin_name, specs, impls)
    return sorted(impls)


def _verify_arguments(
    plugin_name: str, hook_name: str, func: Callable[..., Any], spec: Callable[..., Any]
) -> None:
    spec_args = list(inspect.signature(spec).parameters)
    spec_text = signature_text(hook_name, spec)
    for param in inspect.signature(func).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise PluginError(
                f"plugin {plugin_name!r}: {signature_text(hook_name, func)} uses "
                f"{'*' if param.kind is param.VAR_POSITIONAL else '**'}{param.name}; hooks pass "
                f"only the arguments an implementation names. Name them: {spec_text}."
            )
        if param.name not in spec_args:
            raise PluginError(
                f"plugin {plugin_name!r}: {signature_text(hook_name, func)} takes the argument "
                f"{param.name!r}, which the hook does not provide.{did_you_mean(param.name, spec_args)} "
                f"The spec is {spec_text}; an implementation may take any subset of its arguments."
            )


def _verify_no_unmarked_hooks(
    plugin: object,
    plugin_name: str,
    specs: dict[str, Callable[..., Any]],
    impls: dict[str, Callable[..., Any]],
) -> None:
    for hook_name in specs:
        obj = getattr(plugin, hook_name, None)
        if callable(obj) and hook_name not in impls:
            raise PluginError(
                f"plugin {plugin_name!r}: {hook_name} is defined but not decorated with "
                f"@graft.hookimpl, so it would never be called. Add the decorator."
            )
