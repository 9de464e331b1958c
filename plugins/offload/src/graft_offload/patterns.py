"""Which modules get their inputs offloaded: ``features.offload.modules`` patterns expanded on a model.

``prefix.{*}`` expands to every child of the container at ``prefix``, in order; any other pattern
is matched one dot-segment at a time with shell wildcards (``model.layers.*`` matches
``model.layers.3``, not ``model.layers.3.mlp``). Patterns are taken in the order given (their
order is the forward order the prefetch relies on); a module matched twice is kept once.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING

from graft.errors import ConfigError
from graft_offload.config import WILDCARD_CHILDREN

if TYPE_CHECKING:
    import torch

Selection = list[tuple[str, "torch.nn.Module"]]


def select_modules(model: torch.nn.Module, patterns: Sequence[str],
                   default_blocks: Callable[[torch.nn.Module], Sequence[torch.nn.Module]]
                   ) -> Selection:
    """``(name, module)`` of every module ``patterns`` select, in order; with no patterns, the
    modules ``default_blocks(model)`` returns (the model family's decoder blocks).

    `ConfigError` for a pattern that matches nothing (naming the closest module names), for
    no modules at all, and for a module selected inside another selected one.
    """
    names = {module: name for name, module in model.named_modules()}
    if patterns:
        selected = _expand_all(model, patterns)
    else:
        selected = [(names.get(block, "?"), block) for block in default_blocks(model)]
        if not selected:
            raise ConfigError("features.offload.modules is empty and the model family lists no "
                              "decoder blocks; name the modules to offload, e.g. "
                              "features.offload.modules=[model.layers.{*}]")
    _check_not_nested(selected)
    return selected


def _expand_all(model: torch.nn.Module, patterns: Sequence[str]) -> Selection:
    named = list(model.named_modules())
    selected: Selection = []
    seen: set[int] = set()
    for pattern in patterns:
        matches = expand_pattern(model, pattern, named)
        if not matches:
            raise ConfigError(no_match_message(pattern, [name for name, _ in named if name]))
        for name, module in matches:
            if id(module) not in seen:
                seen.add(id(module))
                selected.append((name, module))
    return selected


def expand_pattern(model: torch.nn.Module, pattern: str,
                   named: Sequence[tuple[str, torch.nn.Module]]) -> Selection:
    """The modules one pattern selects (empty when none)."""
    if pattern.endswith("." + WILDCARD_CHILDREN):
        prefix = pattern[: -len(WILDCARD_CHILDREN) - 1]
        try:
            container = model.get_submodule(prefix)
        except AttributeError:
            return []
        return [(f"{prefix}.{child}", module) for child, module in container.named_children()]
    segments = pattern.split(".")
    return [(name, module) for name, module in named
            if name and _segments_match(name.split("."), segments)]


def _segments_match(name: list[str], pattern: list[str]) -> bool:
    return len(name) == len(pattern) and all(map(fnmatchcase, name, pattern))


def no_match_message(pattern: str, module_names: Sequence[str]) -> str:
    """The error for a pattern that selects nothing: the pattern and the nearest module names."""
    probe = pattern[: -len(WILDCARD_CHILDREN) - 1] if pattern.endswith(WILDCARD_CHILDREN) else pattern
    return (f"features.offload.modules: the pattern {pattern!r} matches no module of the model. "
            f"Nearest module names: {', '.join(nearest_names(probe, module_names)) or 'none'}. "
            f"Use 'prefix.{{*}}' for every child of a container (e.g. 'model.layers.{{*}}') or "
            f"per-segment wildcards ('model.layers.*'); an empty list offloads the model "
            f"family's decoder blocks.")


def nearest_names(probe: str, module_names: Sequence[str], count: int = 3) -> list[str]:
    """The ``count`` module names closest to ``probe``, a name or a per-segment glob: names with
    as many segments come first, and a glob's wildcard segments take each name's own segment."""
    segments = probe.split(".")

    def score(name: str) -> tuple[bool, float]:
        parts = name.split(".")
        if len(parts) != len(segments):
            return False, difflib.SequenceMatcher(None, probe, name).ratio()
        filled = ".".join(n if _is_glob(p) else p for p, n in zip(segments, parts, strict=True))
        return True, difflib.SequenceMatcher(None, filled, name).ratio()

    return sorted(module_names, key=score, reverse=True)[:count]


def _is_glob(segment: str) -> bool:
    return any(c in segment for c in "*?[")


def _check_not_nested(selected: Selection) -> None:
    names = [name for name, _ in selected]
    for outer in names:
        for inner in names:
            if inner.startswith(outer + "."):
                raise ConfigError(
                    f"features.offload.modules selects {inner!r} inside {outer!r}; offload "
                    f"works on one level of blocks: select either the blocks or their children")
