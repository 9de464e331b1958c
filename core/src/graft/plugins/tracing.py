"""``GRAFT_TRACE_PLUGINS=1``: print every hook call, its implementations and its result to stderr."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TextIO

import pluggy

TRACE_ENV = "GRAFT_TRACE_PLUGINS"


MAX_TEXT = 120  # characters of one described value
MAX_ITEMS = 8  # a container or dataclass with more items is described by its type and size


def describe_value(value: Any) -> str:
    """A one-line description, at most `MAX_TEXT` characters, of a hook argument or result.

    Tensors by shape and dtype, modules by class name; lists, dicts and dataclasses (configs,
    contexts) item by item while short, else by class name and size; anything else by the first
    line of its ``repr``, truncated.
    """
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is not None and dtype is not None:
        return f"{type(value).__name__}(shape={tuple(shape)}, dtype={dtype})"
    if hasattr(value, "named_parameters"):
        return f"<{type(value).__name__}>"
    if isinstance(value, (dict, list, tuple)):
        return _describe_container(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _describe_dataclass(value)
    text = repr(value)
    first_line = text.split("\n", 1)[0]
    if len(first_line) <= MAX_TEXT and first_line == text:
        return text
    return first_line[:MAX_TEXT - 3] + "..."


def _describe_container(value: dict[Any, Any] | list[Any] | tuple[Any, ...]) -> str:
    kind = type(value).__name__
    if len(value) <= MAX_ITEMS:
        if isinstance(value, dict):
            text = "{" + ", ".join(f"{k!r}: {describe_value(v)}" for k, v in value.items()) + "}"
        else:
            items = ", ".join(describe_value(v) for v in value)
            text = f"[{items}]" if isinstance(value, list) else f"({items}{',' * (len(value) == 1)})"
        if len(text) <= MAX_TEXT:
            return text
    if isinstance(value, dict):
        keys = ", ".join(map(str, list(value)[:3]))
        return f"{kind}(len={len(value)}, keys={keys}{', ...' if len(value) > 3 else ''})"
    return f"{kind}(len={len(value)})"


def _describe_dataclass(value: Any) -> str:
    name = type(value).__name__
    fields = dataclasses.fields(value)
    if len(fields) <= MAX_ITEMS:
        text = f"{name}(" + ", ".join(f"{f.name}={describe_value(getattr(value, f.name))}"
                                      for f in fields) + ")"
        if len(text) <= MAX_TEXT:
            return text
    return f"<{name}>"


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
