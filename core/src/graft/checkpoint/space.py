"""Disk space for checkpoints: what a save needs, what is free, and whether a failed save ran out.

A save is checked before it writes anything (`CheckpointManager` refuses one that cannot fit) and
a save that fails anyway is reported as a full disk when it was one: DCP's own message for a
write cut short is torch's ``[enforce fail at inline_container.cc:672] unexpected pos``, which
names neither the disk nor the cause.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

# Errors a write gets from a full disk (or a full quota, or a file size limit).
FULL_DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
# What a save writes besides the tensors (DCP metadata, trainer.json, RNG states, manifest).
OVERHEAD_BYTES = 1 << 20
# Free space below which a failed write is taken for a full disk (a write fills the disk to
# its last blocks before it fails).
NEARLY_FULL_BYTES = 1 << 20


def state_bytes(state: dict[str, Any]) -> int:
    """Bytes of the tensors in a nested state dict at their global shape (a sharded DTensor
    counts whole: the save writes every shard), i.e. what a checkpoint of it holds."""
    total = 0
    for value in state.values():
        if isinstance(value, dict):
            total += state_bytes(value)
        elif isinstance(value, torch.Tensor):
            total += value.numel() * value.element_size()
    return total


def existing_folder(path: Path) -> Path:
    """``path``, or the nearest folder above it that exists."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_bytes(path: Path) -> int:
    """Bytes free to this process on the file system that holds ``path`` (or would hold it)."""
    return shutil.disk_usage(existing_folder(path)).free


def folder_bytes(path: Path) -> int:
    """Total size of the files under ``path`` (0 when it does not exist)."""
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except FileNotFoundError:  # removed while we walked
                continue
    return total


def human(count: float) -> str:
    """Bytes as ``1.2 GB`` (decimal units, like ``df -H``)."""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(count) < 1000:
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    return f"{count:.1f} TB"


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, its causes and contexts, and the per-rank failures DCP collects."""
    seen: set[int] = set()
    stack = [exc]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        stack += [e for e in (current.__cause__, current.__context__) if e is not None]
        failures = getattr(current, "failures", None)
        if isinstance(failures, dict):
            stack += [f[0] if isinstance(f, tuple) else f for f in failures.values()
                      if isinstance(f[0] if isinstance(f, tuple) else f, BaseException)]


def ran_out_of_space(exc: BaseException, folder: Path) -> bool:
    """Whether a save into ``folder`` that failed with ``exc`` failed for want of disk space: an
    ENOSPC-like error anywhere in its chain, or less than `NEARLY_FULL_BYTES` left free there
    (torch's zip writer reports a write cut short by a full disk only as ``unexpected pos``)."""
    for cause in _causes(exc):
        if isinstance(cause, OSError) and cause.errno in FULL_DISK_ERRNOS:
            return True
        if "No space left on device" in str(cause):
            return True
    return free_bytes(folder) < NEARLY_FULL_BYTES
