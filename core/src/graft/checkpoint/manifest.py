"""``manifest.json``: the size and SHA-256 of every file of a checkpoint.

Written at save time (ranks hash disjoint subsets of the files, just written and still in the page
cache), checked before a load and by ``graft ckpt verify``, so a truncated or corrupted file is
reported by name before anything is loaded.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch.distributed as dist

from graft.errors import CheckpointError

MANIFEST = "manifest.json"
_CHUNK = 16 << 20


def sha256_of(path: Path) -> str:
    """Hex SHA-256 of a file, read in 16 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST)


def _split_work(items: list[Any], rank: int, world: int) -> list[Any]:
    return items[rank::world]


def build_manifest(root: Path, *, rank: int = 0, world: int = 1,
                   group: dist.ProcessGroup | None = None) -> dict[str, dict[str, Any]]:
    """Hash the files under ``root``, shared among the ``world`` ranks of ``group`` (default:
    all); every rank gets the result."""
    files = _files(root)
    mine = {str(p.relative_to(root)): {"size": p.stat().st_size, "sha256": sha256_of(p)}
            for p in _split_work(files, rank, world)}
    if world > 1:
        gathered: list[dict[str, Any]] = [{} for _ in range(world)]
        dist.all_gather_object(gathered, mine, group=group)
        mine = {k: v for part in gathered for k, v in part.items()}
    return dict(sorted(mine.items()))


def write_manifest(root: Path, entries: dict[str, dict[str, Any]]) -> None:
    """Write ``manifest.json`` into ``root``."""
    (root / MANIFEST).write_text(json.dumps({"files": entries}, indent=1))


def read_manifest(root: Path) -> dict[str, dict[str, Any]]:
    """The manifest's file table; `CheckpointError` when it is missing or unreadable."""
    path = root / MANIFEST
    try:
        return json.loads(path.read_text())["files"]
    except FileNotFoundError as exc:
        raise CheckpointError(f"{path} is missing: {root} is not a complete Graft checkpoint") from exc
    except (ValueError, KeyError) as exc:
        raise CheckpointError(f"{path} is corrupted: {exc}") from exc


# What `verify_files` tells a run about to resume from a damaged checkpoint.
RESUME_ADVICE = "resume from an older checkpoint (checkpoint.resume=PATH) or start over"


def size_problems(root: Path, entries: dict[str, dict[str, Any]]) -> list[str]:
    """For each file the manifest lists that is missing or has another size on disk: what is
    wrong with it (a sentence naming the file)."""
    problems = []
    for name, expected in entries.items():
        path = root / name
        if not path.is_file():
            problems.append(f"{path} is missing")
        elif path.stat().st_size != expected["size"]:
            problems.append(f"{path} has {path.stat().st_size} bytes, the checkpoint wrote "
                            f"{expected['size']} (truncated or overwritten)")
    return problems


def verify_files(root: Path, *, checksums: bool, rank: int = 0, world: int = 1,
                 advice: str = RESUME_ADVICE, group: dist.ProcessGroup | None = None) -> None:
    """Check every file the manifest lists: present, same size, and (optionally) same SHA-256;
    a `CheckpointError` naming the first damaged file ends with ``advice`` (what to do).

    With several ranks (the ``world`` ranks of ``group``, default all) the checksum work is
    shared and the first failure is raised everywhere.
    """
    entries = read_manifest(root)
    problem = next(iter(size_problems(root, entries)), None)  # the first one
    if problem is None and checksums:
        for name in _split_work(list(entries), rank, world):
            if sha256_of(root / name) != entries[name]["sha256"]:
                problem = f"{root / name} is corrupted (SHA-256 differs from manifest.json)"
                break
    if world > 1:
        problems: list[str | None] = [None] * world
        dist.all_gather_object(problems, problem, group=group)
        problem = next((p for p in problems if p), None)
    if problem:
        raise CheckpointError(f"checkpoint {root} is damaged: {problem}; {advice}")
