"""``graft config check``: validate shipped and user YAML files against the full schema.

This is the check that catches a key left behind after a rename (verl's stale
``ref.router_replay``): every file is composed exactly as ``graft train --config FILE`` would.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from graft.config.compose import compose
from graft.config.presets import available_presets
from graft.errors import GraftError
from graft.plugins import GraftPluginManager

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


def check_config_files(paths: Sequence[str | Path], manager: GraftPluginManager) -> list[CheckResult]:
    """Compose each file (or every preset when ``paths`` is empty) and collect the errors."""
    files = yaml_files(paths) if paths else list(available_presets(manager).values())
    results = []
    for path in files:
        try:
            compose(config_files=[path], manager=manager)
            results.append(CheckResult(path, None))
        except GraftError as exc:
            results.append(CheckResult(path, str(exc)))
    return results
