"""Where checkpoints live and which one is current.

``<run_dir>/checkpoints/step_<N>/`` holds one complete checkpoint; ``<run_dir>/checkpoints/latest``
names the newest complete one and is replaced atomically, last. A save writes into a hidden
``.tmp-*`` folder first; a crash at any moment leaves either the previous ``latest`` or the new
one, never a partial checkpoint under a ``step_<N>`` name.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from pathlib import Path

from graft.errors import CheckpointError

_STEP = re.compile(r"^step_(\d+)$")
LATEST = "latest"
TMP_PREFIX = ".tmp-"


def checkpoints_dir(run_dir: Path) -> Path:
    """``<run_dir>/checkpoints``."""
    return run_dir / "checkpoints"


def step_dir(run_dir: Path, step: int) -> Path:
    """``<run_dir>/checkpoints/step_<step>``."""
    return checkpoints_dir(run_dir) / f"step_{step}"


def step_of(path: Path) -> int:
    """The step number of a ``step_<N>`` folder."""
    match = _STEP.match(path.name)
    if match is None:
        raise CheckpointError(f"{path} is not a checkpoint folder (expected step_<N>)")
    return int(match.group(1))


def fsync_path(path: Path) -> None:
    """Flush a file or folder entry to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """Flush every file under ``root``, then the folders themselves."""
    for folder, _, files in os.walk(root):
        for name in files:
            fsync_path(Path(folder) / name)
        fsync_path(Path(folder))


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename."""
    partial = path.with_name(f"{TMP_PREFIX}{path.name}")
    with partial.open("w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, path)
    fsync_path(path.parent)


def read_latest(run_dir: Path) -> Path | None:
    """The checkpoint ``latest`` names, or None when there is none yet.

    If the named folder is gone (a crash while a checkpoint of the same step was replaced), the
    newest ``step_<N>`` folder is used: every such folder is complete by construction.
    """
    marker = checkpoints_dir(run_dir) / LATEST
    if not marker.is_file():
        return None
    target = checkpoints_dir(run_dir) / marker.read_text().strip()
    if target.is_dir():
        return target
    remaining = complete_checkpoints(run_dir)
    return remaining[-1] if remaining else None


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """Every ``step_<N>`` folder, oldest first."""
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if p.is_dir() and _STEP.match(p.name)), key=step_of)


def replace_dir(tmp: Path, final: Path) -> None:
    """Make the fully written folder ``tmp`` durable and move it to ``final``, replacing what is
    there: at every moment ``final`` is either the old folder or the new one, never a mix."""
    fsync_tree(tmp)
    replaced = None
    if final.exists():
        replaced = final.with_name(f"{TMP_PREFIX}replaced-{final.name}-{uuid.uuid4().hex[:8]}")
        os.replace(final, replaced)
    os.replace(tmp, final)
    fsync_path(final.parent)
    if replaced is not None:
        shutil.rmtree(replaced, ignore_errors=True)


def publish(tmp: Path, final: Path) -> None:
    """Move a fully written checkpoint into place (replacing a re-save of the same step, after
    resuming from an older checkpoint), then point ``latest`` at it."""
    replace_dir(tmp, final)
    write_atomically(final.parent / LATEST, final.name + "\n")


def prune(run_dir: Path, keep_last: int) -> list[Path]:
    """Delete all but the newest ``keep_last`` checkpoints and stale temporary folders."""
    removed = []
    root = checkpoints_dir(run_dir)
    for stale in root.glob(f"{TMP_PREFIX}*"):
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
            removed.append(stale)
    latest = read_latest(run_dir)
    for path in complete_checkpoints(run_dir)[:-keep_last] if keep_last > 0 else []:
        if path != latest:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def removable_before_save(run_dir: Path, step: int, keep_last: int) -> list[Path]:
    """What `prune` would delete once a checkpoint of ``step`` is published and what may go
    before it is written: stale temporary folders, and the checkpoints outside the newest
    ``keep_last`` (counting the new one), except the one ``latest`` names now (kept until the
    new one is published, so a failed save leaves it)."""
    root = checkpoints_dir(run_dir)
    stale = [p for p in root.glob(f"{TMP_PREFIX}*") if p.is_dir()] if root.is_dir() else []
    if keep_last <= 0:
        return stale
    existing = complete_checkpoints(run_dir)
    kept = sorted({step_of(p) for p in existing} | {step})[-keep_last:]
    latest = read_latest(run_dir)
    return stale + [p for p in existing if step_of(p) not in kept and p != latest]
