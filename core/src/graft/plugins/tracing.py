"""``GRAFT_TRACE_PLUGINS=1``: print every hook call, its implementations and its result to stderr."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TextIO

import pluggy

TRACE_ENV = "GRAFT_TRACE_PLUGINS"


def describe_value(value: Any) -> str:
    """A short description of a hook argument or result: tensors by shape and dtype, not content."""
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is not None and dtype is not None:
        return f"{type(value).__name__}(shape={tuple(shape)}, dtype={dtype})"
    if hasattr(value, "named_parameters"):
        return f"<{type(value).__name__}>"
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def install_tracing(
    pm: pluggy.PluginManager, stream: TextIO | None = None
) -> Callable[[], None]:
    """Trace every hook call of ``pm`` to ``stream`` (stderr); return a function that undoes it."""

    def before(
        hook_name: str, impls: Sequence[pluggy.HookImpl], kwargs: Mapping[str, Any]
    ) -> None:
        args = ", ".join(f"{k}={describe_value(v)}" for k, v in kwargs.items())
        names = ", ".join(impl.plugin_name for impl in impls) or "no implementations"
        print(f"[graft.trace] {hook_name}({args}) -> [{names}]", file=stream or sys.stderr)

    def after(
        outcome: pluggy.Result[Any],
        hook_name: str,
        impls: Sequence[pluggy.HookImpl],
        kwargs: Mapping[str, Any],
    ) -> None:
        if outcome.exception is not None:
            result = f"raised {type(outcome.exception).__name__}: {outcome.exception}"
        else:
            result = describe_value(outcome.get_result())
        print(f"[graft.trace] {hook_name} => {result}", file=stream or sys.stderr)

    return pm.add_hookcall_monitoring(before, after)
