"""The hook contract (``graft.hookspecs``) and the docs send plugin authors to public names only:
a ``graft.<x>.<name>`` they write must be public in the sense of tests/test_public_api.py (in
the ``__all__`` of ``graft`` or of ``graft.<x>``), so a plugin following them never imports a
module the core may change without notice."""

from __future__ import annotations

import re
from pathlib import Path

from tests.test_public_api import public_api

REPO = Path(__file__).resolve().parents[1]
# the spec modules (the package's __init__ imports them by their module names)
SOURCES = [*sorted((REPO / "core" / "src" / "graft" / "hookspecs").glob("[!_]*.py")),
           *sorted((REPO / "docs").glob("*.md"))]
# graft.testing's submodules import torch, so the package documents rather than re-exports them;
# graft.testing.chat (its own __all__) writes the tiny chat model and data of the own-data page
DOCUMENTED_SUBMODULES = {"graft.testing.checkpoint", "graft.testing.families",
                         "graft.testing.invariance", "graft.testing.chat"}
# Known exceptions: none left (docs/design.md maps the core by paths, not module names).
KNOWN: set[tuple[str, str]] = set()
DOTTED = re.compile(r"\bgraft(?:\.[A-Za-z_]\w*)+")


def is_private(name: str, api: dict[str, set[str]]) -> bool:
    """True for a dotted ``graft.`` name that reads past the public API (attributes of a public
    name, ``graft.rl.RewardFunction.preload``, are fine)."""
    parts = name.split(".")
    if parts[1] in api["graft"] or any(name.startswith(m) for m in DOCUMENTED_SUBMODULES):
        return False
    module = f"graft.{parts[1]}"
    return module not in api or (len(parts) > 2 and parts[2] not in api[module])


def private_names() -> set[tuple[str, str]]:
    api = public_api()
    return {(str(path.relative_to(REPO)), name) for path in SOURCES
            for name in DOTTED.findall(path.read_text()) if is_private(name, api)}


def test_hook_docs_and_docs_name_only_public_graft_names() -> None:
    found = sorted(private_names() - KNOWN)
    assert not found, ("private graft names in the hook contract or the docs (make the name "
                       "public, documented and tested, or say it without the module path): "
                       + "; ".join(f"{file}: {name}" for file, name in found))


def test_the_known_list_only_shrinks() -> None:
    fixed = sorted(KNOWN - private_names())
    assert not fixed, f"fixed: remove from KNOWN: {fixed}"


def test_the_scan_flags_private_names() -> None:
    api = public_api()
    assert is_private("graft.engine.batch.micro_batch.PackedLayout", api)
    assert is_private("graft.losses.aggregation.AggregationContext", api)
    assert not is_private("graft.losses.AggregationContext", api)
    assert not is_private("graft.rl.RewardFunction.preload", api)
    assert not is_private("graft.errors.ConfigError", api)
