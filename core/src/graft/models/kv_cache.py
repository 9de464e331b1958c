"""The keyword a transformers model takes its KV cache by, on every transformers Graft supports.

transformers 5.17-5.23 name it ``past_key_values``; 5.24 renamed it ``cache`` in every model's
``forward`` (and in ``generate``'s calls to it), keeps ``past_key_values`` as a deprecated alias
until 5.40 (a warning per call) and names the output field ``cache`` too. Code that passes a
cache to a model calls `cache_argument`; a hook that reads the cache a model was called with
(``register_forward_pre_hook(..., with_kwargs=True)``) calls `passed_cache`, which accepts both
names: ``generate`` uses the new one, older callers the alias.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from typing import Any

# The current name first: `passed_cache` prefers it when a caller passed both.
CACHE_KEYWORDS = ("cache", "past_key_values")


def cache_keyword(model: Any) -> str:
    """``"cache"`` or ``"past_key_values"``: the name ``model``'s ``forward`` takes its KV cache
    by. Read from the signature (a plugin's own model may differ from the installed
    transformers); a ``forward`` that names neither (``**kwargs`` only) gets the name the
    installed transformers' ``generate`` passes."""
    return _keyword_of(type(model))


def cache_argument(model: Any, cache: Any) -> dict[str, Any]:
    """``{keyword: cache}`` for ``model(**inputs, **cache_argument(model, cache))``."""
    return {cache_keyword(model): cache}


def passed_cache(kwargs: Mapping[str, Any]) -> Any:
    """The KV cache in a model call's keyword arguments under either name, else ``None``."""
    for name in CACHE_KEYWORDS:
        if kwargs.get(name) is not None:
            return kwargs[name]
    return None


@functools.cache
def _keyword_of(model_class: type) -> str:
    forward = getattr(model_class, "forward", None)
    names = _parameters(forward) if forward is not None else set()
    for name in CACHE_KEYWORDS:
        if name in names:
            return name
    return _generate_keyword()


@functools.cache
def _generate_keyword() -> str:
    from transformers.generation.utils import GenerationMixin

    names = _parameters(GenerationMixin.prepare_inputs_for_generation)
    return "cache" if "cache" in names else "past_key_values"


def _parameters(function: Any) -> set[str]:
    try:
        return set(inspect.signature(function).parameters)
    except (TypeError, ValueError):  # a builtin or C callable without a signature
        return set()
