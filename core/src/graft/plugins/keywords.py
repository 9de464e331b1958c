"""Calling plugin-provided functions with only the keyword arguments they declare.

Hooks get this from pluggy; the functions plugins hand over through registries (policy losses,
advantage estimators, a family's ``parallelize``) get it here, so the core can pass new
arguments without breaking functions written before them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any


def accepted_keywords(fn: Callable[..., Any], offered: dict[str, Any]) -> dict[str, Any]:
    """The entries of ``offered`` that ``fn`` declares (all of them if it takes ``**kwargs``)."""
    parameters = inspect.signature(fn).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return dict(offered)
    names = {p.name for p in parameters
             if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)}
    return {k: v for k, v in offered.items() if k in names}


def call_with_keywords(fn: Callable[..., Any], *args: Any, **offered: Any) -> Any:
    """``fn(*args, **kw)`` where ``kw`` holds only the ``offered`` keywords ``fn`` declares."""
    return fn(*args, **accepted_keywords(fn, offered))
