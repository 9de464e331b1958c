"""Reading a checkpoint without the model that wrote it: summaries and full tensors, on CPU.

Used by ``graft ckpt inspect|verify`` and ``graft export --ckpt``; works in a single process
whatever the world size that saved the checkpoint.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from graft.checkpoint import layout
from graft.checkpoint.backfill import parameter_of
from graft.checkpoint.manifest import read_manifest, size_problems
from graft.checkpoint.safe_io import (
    SafeFileSystemReader,
    SafeLoadPlanner,
    dcp_failures,
    read_metadata,
)
from graft.errors import CheckpointError

ACCEPTED_FORMS = ("a checkpoint folder <run_dir>/checkpoints/step_<N>, the marker file "
                  "<run_dir>/checkpoints/latest, the folder <run_dir>/checkpoints, or a run "
                  "directory <run_dir>")


def resolve_checkpoint(path: str | Path) -> Path:
    """The ``step_<N>`` folder that ``path`` designates.

    ``path`` is a ``step_<N>`` folder (returned as given), ``<run_dir>/checkpoints/latest``,
    ``<run_dir>/checkpoints`` or ``<run_dir>`` (each meaning the checkpoint ``latest`` names).
    Anything else is a `CheckpointError` listing these forms.
    """
    given = Path(path).expanduser()
    if not given.exists():
        raise CheckpointError(f"{given} does not exist; give {ACCEPTED_FORMS}")
    if given.is_file():
        if given.name != layout.LATEST:
            raise CheckpointError(f"{given} is a file, not a checkpoint; give {ACCEPTED_FORMS}")
        return _latest_of(_parent(_parent(given)), given)
    if _is_step_dir(given):
        return given
    if _is_checkpoints_dir(given):
        return _latest_of(_parent(given), given)
    if layout.checkpoints_dir(given).is_dir():
        return _latest_of(given, given)
    if (given / "config.yaml").is_file():
        raise CheckpointError(f"{given} is a run directory without a checkpoints/ folder: the "
                              f"run saved no checkpoint yet")
    raise CheckpointError(f"{given} is not a checkpoint (no .metadata, no checkpoints/latest); "
                          f"give {ACCEPTED_FORMS}")


def run_dir_of(checkpoint: Path) -> Path | None:
    """The run directory of a ``<run_dir>/checkpoints/step_<N>`` folder (absolute), or None
    when the checkpoint is not inside a ``checkpoints`` folder."""
    folder = Path(os.path.abspath(checkpoint))
    if folder.parent.name != layout.checkpoints_dir(Path()).name:
        return None
    return folder.parent.parent


def _parent(path: Path) -> Path:
    # Lexical, so a relative path stays relative ("latest" -> "." -> "..").
    return Path(os.path.normpath(path / os.pardir))


def _is_step_dir(folder: Path) -> bool:
    # The name alone counts, so a damaged step_<N> folder reaches the checks that name its damage.
    if (folder / ".metadata").is_file():
        return True
    try:
        layout.step_of(folder)
    except CheckpointError:
        return False
    return True


def _is_checkpoints_dir(folder: Path) -> bool:
    return (folder.name == layout.checkpoints_dir(Path()).name
            or (folder / layout.LATEST).is_file())


def _latest_of(run_dir: Path, given: Path) -> Path:
    """The checkpoint ``<run_dir>/checkpoints/latest`` names; ``given`` is what the user typed."""
    latest = layout.read_latest(run_dir)
    if latest is None:
        found = layout.complete_checkpoints(run_dir)
        hint = (f"; the step folders there ({', '.join(p.name for p in found)}) can be given "
                f"directly" if found else "; the run saved no checkpoint yet")
        raise CheckpointError(f"{given}: {layout.checkpoints_dir(run_dir) / layout.LATEST} "
                              f"does not exist, so there is no complete checkpoint to use{hint}")
    return latest


@dataclass
class CheckpointSummary:
    """What ``graft ckpt inspect`` reports; ``size_bytes`` is what is on disk now, and
    ``damaged_files`` says which files of the manifest are missing or have another size."""

    path: str
    step: int
    world_size: int
    graft_version: str
    saved_at: str
    size_bytes: int
    num_files: int
    parameter_count: int
    num_tensors: int
    params_without_optimizer_state: list[str] = field(default_factory=list)
    damaged_files: list[str] = field(default_factory=list)
    config_yaml: str = ""


def summarize(path: Path) -> CheckpointSummary:
    """Read the metadata, trainer.json and manifest of a checkpoint (no tensor data)."""
    metadata = read_metadata(path).state_dict_metadata
    try:
        trainer = json.loads((path / "trainer.json").read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path / 'trainer.json'} is missing or corrupted: {exc}") from exc
    files = read_manifest(path)
    params = {k[len("model."):]: v for k, v in metadata.items() if k.startswith("model.")}
    with_state = {parameter_of(k.removeprefix("optim.")) for k in metadata
                  if k.startswith("optim.state.")}
    config = path / "config.yaml"
    return CheckpointSummary(
        path=str(path), step=trainer["step"], world_size=trainer["world_size"],
        graft_version=trainer.get("graft_version", "?"), saved_at=trainer.get("saved_at", "?"),
        size_bytes=sum((path / name).stat().st_size for name in files
                       if (path / name).is_file()),
        num_files=len(files), damaged_files=size_problems(path, files),
        parameter_count=sum(v.size.numel() for v in params.values()
                            if isinstance(v, TensorStorageMetadata)),
        num_tensors=len(params),
        params_without_optimizer_state=sorted(set(params) - with_state),
        config_yaml=config.read_text() if config.is_file() else "")


def load_tensors(path: Path, prefix: str = "model.", *, note: str = "") -> dict[str, torch.Tensor]:
    """Every tensor whose key starts with ``prefix``, in full, on CPU (single process); a
    failed read is a `CheckpointError` ending with ``note`` (what to do)."""
    metadata = read_metadata(path).state_dict_metadata
    wanted = {k: torch.empty(tuple(v.size), dtype=v.properties.dtype)
              for k, v in metadata.items()
              if k.startswith(prefix) and isinstance(v, TensorStorageMetadata)}
    if not wanted:
        raise CheckpointError(f"checkpoint {path} holds no tensors under {prefix!r}")
    with dcp_failures(f"reading the shards of checkpoint {path}", note=note), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "assuming ... load in a single process"
        dcp.load(wanted, storage_reader=SafeFileSystemReader(str(path)),
                 planner=SafeLoadPlanner(), no_dist=True)
    return {k[len(prefix):]: v for k, v in wanted.items()}


def summary_dict(summary: CheckpointSummary) -> dict[str, Any]:
    """JSON-ready summary (without the config text)."""
    data = dict(summary.__dict__)
    data.pop("config_yaml")
    return data
