"""Finding plugins: entry points in the group ``graft.plugins`` and the user's selection of them.

Nothing here imports a plugin; that happens in `graft.plugins.manager`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points

from graft.errors import PluginError, did_you_mean

ENTRY_POINT_GROUP = "graft.plugins"
ALLOWLIST_ENV = "GRAFT_PLUGINS"
DISABLE_ENV = "GRAFT_DISABLE_PLUGINS"


@dataclass(frozen=True)
class Candidate:
    """One discovered plugin: an entry point and the distribution that ships it."""

    name: str
    target: str
    distribution: str
    version: str
    entry_point: EntryPoint


def discover_candidates(group: str = ENTRY_POINT_GROUP) -> list[Candidate]:
    """Return every plugin exposed in entry-point ``group``, sorted by name.

    Raises `PluginError` when two different distributions expose the same plugin name: pluggy
    would silently keep one, and the user would not know which.
    """
    by_name: dict[str, Candidate] = {}
    for ep in entry_points(group=group):
        dist = ep.dist
        candidate = Candidate(
            name=ep.name,
            target=ep.value,
            distribution=dist.name if dist is not None else "<unknown>",
            version=dist.version if dist is not None else "<unknown>",
            entry_point=ep,
        )
        previous = by_name.get(ep.name)
        if previous is not None and previous.distribution != candidate.distribution:
            raise PluginError(
                f"two installed distributions expose the Graft plugin {ep.name!r}: "
                f"{previous.distribution} {previous.version} ({previous.target}) and "
                f"{candidate.distribution} {candidate.version} ({candidate.target}). "
                f"Uninstall one of them (pip uninstall {candidate.distribution}) or rename "
                f"its entry point in the group {group!r}."
            )
        by_name.setdefault(ep.name, candidate)
    return [by_name[name] for name in sorted(by_name)]


def parse_name_list(text: str | None) -> list[str] | None:
    """Parse a comma-separated list of plugin names; None stays None (unset)."""
    if text is None:
        return None
    return [part.strip() for part in text.split(",") if part.strip()]


def allowlist_from_env() -> list[str] | None:
    """The ``GRAFT_PLUGINS`` allowlist: None when unset (all plugins), [] when empty (none)."""
    return parse_name_list(os.environ.get(ALLOWLIST_ENV))


def disabled_from_env() -> list[str]:
    """The plugin names in ``GRAFT_DISABLE_PLUGINS`` (set by ``--disable-plugin`` for children)."""
    return parse_name_list(os.environ.get(DISABLE_ENV)) or []


def check_names_exist(
    names: Iterable[str], known: Sequence[str], *, source: str
) -> None:
    """Raise `PluginError` for the first name in ``names`` that no installed plugin has.

    ``source`` says where the user wrote the name (``GRAFT_PLUGINS``, ``--disable-plugin``), so
    the message points at the setting to fix.
    """
    for name in names:
        if name not in known:
            installed = ", ".join(known) if known else "none"
            raise PluginError(
                f"{source} names the plugin {name!r}, but no installed distribution provides "
                f"it (installed Graft plugins: {installed}).{did_you_mean(name, known)} "
                f"Install it (pip install ...) or fix the name."
            )
