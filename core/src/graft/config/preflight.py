"""Checks of a composed config that need no model, data or ranks: the paths it names.

``graft train`` runs `preflight` after composing the config and before it trains or launches
torchrun, so a missing model directory or weights, a folder without tokenizer files, a missing
dataset file or a run directory that cannot be written is reported in a second, once, instead of
by every rank after torch, the process group and the model have loaded. Each check is the
function that loading itself calls, so the message is the same either way. Cheap: no torch or
transformers import.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from graft.errors import ConfigError

RUNS = Path("runs")  # where a run without trainer.run_dir goes (graft.training.run_dir.RUNS)


def preflight(cfg: Any) -> None:
    """Raise the `graft.errors.GraftError` that loading ``cfg``'s model directory and weights
    (``model.path``), tokenizer files (``data.tokenizer``, else ``model.path``) or dataset files
    (``data.path`` for ``data.source=file``, ``data.val_path``) would raise, in the order a run
    loads them; then check that the run directory can be written (`check_run_dir_writable`)."""
    from graft.data.files import dataset_file, training_file
    from graft.data.tokenizer import tokenizer_source
    from graft.models.build import model_weights

    if cfg.model.path:
        model_weights(cfg.model.path)
    tokenizer_source(cfg.data.tokenizer, cfg.model.path)
    path = training_file(cfg.data)
    if path is not None:
        dataset_file(path, "data.path")
    if cfg.data.val_path:
        dataset_file(cfg.data.val_path, "data.val_path")
    check_run_dir_writable(cfg.trainer.run_dir)


def check_run_dir_writable(run_dir: str | None) -> None:
    """`ConfigError` unless files can be created in ``trainer.run_dir`` (unset: under ``runs/``
    in the current folder), or in the nearest existing folder above it when it does not exist
    yet: a read-only disk, a missing permission, or a file where a folder is needed. A probe
    file is created there and removed at once (a permission check alone misses read-only
    mounts for root)."""
    target = Path(run_dir).expanduser() if run_dir else RUNS
    what = (f"trainer.run_dir {run_dir!r}" if run_dir
            else f"trainer.run_dir is unset, so the run goes under {str(RUNS)!r}, and that")
    existing = target
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"{what} cannot be created: {existing} is a file, not a folder; set "
                          f"trainer.run_dir to a folder you can write to")
    try:
        handle, probe = tempfile.mkstemp(prefix=".graft-write-check-", dir=existing)
        os.close(handle)
        os.unlink(probe)
    except OSError as exc:
        where = "" if existing == target else f" (in {existing}, where it would be created)"
        raise ConfigError(f"{what} is not writable: cannot create a file{where}: "
                          f"{exc.strerror or exc}; set trainer.run_dir to a folder you can "
                          f"write to") from exc
