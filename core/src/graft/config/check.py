"""``graft config check``: validate shipped and user YAML files against the full schema.

This is the check that catches a key left behind after a rename (verl's stale
``ref.router_replay``): every file is composed exactly as ``graft train --config FILE`` would.
Without paths it checks the presets of Graft and of the loaded plugins, and ``./examples``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from graft.config.compose import compose
from graft.config.hooks import PluginManager
from graft.config.presets import available_presets
from graft.errors import GraftError

EXAMPLES = "examples"  # the folder of example configs in a checkout of Graft
_SKIPPED_DIRS = {".git", ".venv", "venv", "node_modules", "__pycache__", "build", "dist"}


@dataclass(frozen=True)
class CheckResult:
    """The outcome of checking one YAML file: ``error`` is None when it is valid."""

    path: Path
    error: str | None


def yaml_files(paths: Sequence[str | Path]) -> list[Path]:
    """Expand files and folders (recursively) into a sorted list of YAML files."""
    files: set[Path] = set()
    for item in paths:
        path = Path(item)
        if path.is_dir():
            files.update(p for p in _walk_yaml(path))
        else:
            files.add(path)
    return sorted(files)


def _walk_yaml(folder: Path) -> Iterable[Path]:
    for path in folder.rglob("*"):
        if path.suffix in (".yaml", ".yml") and not _SKIPPED_DIRS & set(path.parts):
            yield path


@dataclass(frozen=True)
class CheckSource:
    """Files ``graft config check`` validates when given no path, and where they come from."""

    label: str
    files: list[Path]


def default_sources(manager: PluginManager, cwd: Path | None = None) -> list[CheckSource]:
    """Presets of Graft and of every loaded plugin (one source per folder), then the YAML files
    of ``examples/`` in ``cwd`` (the current folder by default) when there is one: run from a
    checkout of Graft, that is the repository's examples."""
    by_folder: dict[Path, list[Path]] = {}
    for path in available_presets(manager).values():
        by_folder.setdefault(path.parent, []).append(path)
    sources = [CheckSource(f"presets in {folder}", files) for folder, files in by_folder.items()]
    examples = cwd / EXAMPLES if cwd is not None else Path(EXAMPLES)
    if examples.is_dir():
        sources.append(CheckSource(f"{examples}/ (example configs in the current folder)",
                                   yaml_files([examples])))
    return sources


def check_config_files(paths: Sequence[str | Path], manager: PluginManager) -> list[CheckResult]:
    """Compose each file (or those of `default_sources` when ``paths`` is empty); collect errors."""
    files = (yaml_files(paths) if paths
             else [f for source in default_sources(manager) for f in source.files])
    results = []
    for path in files:
        try:
            compose(config_files=[path], manager=manager)
            results.append(CheckResult(path, None))
        except GraftError as exc:
            results.append(CheckResult(path, str(exc)))
    return results
