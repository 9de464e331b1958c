"""Finding plugins: entry points in the group ``graft.plugins``, the user's selection of them, and
whether what their distributions require is installed.

Nothing here imports a plugin; that happens in `graft.plugins.manager`.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib.metadata import (
    Distribution,
    EntryPoint,
    PackageNotFoundError,
    entry_points,
    version,
)

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


@dataclass(frozen=True)
class RequirementCheck:
    """A distribution's declared requirements (its extras aside) that are not installed, and
    those installed at a version outside the declared range (``name spec (version installed)``)."""

    missing: tuple[str, ...] = ()
    mismatched: tuple[str, ...] = ()


def _canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _requirements(dist: Distribution | None) -> list:
    """The `packaging` requirements ``dist`` declares for every install (no extra's)."""
    from packaging.requirements import InvalidRequirement, Requirement

    found = []
    for text in (dist.requires or []) if dist is not None else []:
        try:
            requirement = Requirement(text)
        except InvalidRequirement:
            continue
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            found.append(requirement)
    return found


def check_requirements(dist: Distribution | None) -> RequirementCheck:
    """What ``dist`` requires that this environment lacks (read from the installed metadata, as
    ``pip check`` does; a requirement without metadata counts as installed when a module of its
    name imports, as in images that copy packages in without their metadata)."""
    missing, mismatched = [], []
    for requirement in _requirements(dist):
        try:
            installed = version(requirement.name)
        except PackageNotFoundError:
            module = _canonical(requirement.name).replace("-", "_")
            try:
                found = importlib.util.find_spec(module) is not None
            except (ImportError, ValueError):
                found = False
            if not found:
                missing.append(str(requirement))
            continue
        if requirement.specifier and not requirement.specifier.contains(installed,
                                                                         prereleases=True):
            mismatched.append(f"{requirement} ({installed} installed)")
    return RequirementCheck(tuple(missing), tuple(mismatched))


def missing_message(candidate: Candidate, missing: Sequence[str]) -> str:
    """The error of a plugin whose distribution requires ``missing``: what and the pip command."""
    names = ", ".join(missing)
    command = " ".join(f"'{m}'" for m in missing)
    return (f"missing dependency: {candidate.distribution} {candidate.version} requires {names}, "
            f"which {'is' if len(missing) == 1 else 'are'} not installed (installed with "
            f"--no-deps?); install {'it' if len(missing) == 1 else 'them'}: pip install {command}")


def install_hint(module: str) -> str:
    """How to install the distribution of the top-level ``module``: the requirement a Graft
    plugin distribution declares for it (``pip install 'math-verify>=0.9'``, the plugin named),
    else a guess from the module's name."""
    top = module.split(".")[0]
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        for requirement in _requirements(ep.dist):
            if _canonical(requirement.name) == _canonical(top):
                return (f"pip install '{requirement}' (the plugin {ep.name!r}, "
                        f"{ep.dist.name}, requires it)")
    return (f"install the distribution that provides {top!r} (pip install {_canonical(top)}, if "
            f"that is its name)")
