"""Checks of a composed config that need no model, data or ranks: the paths it names.

``graft train`` runs `preflight` after composing the config and before it trains or launches
torchrun, so a missing model directory, dataset file or tokenizer directory is reported in a
second, once, instead of by every rank after torch and the process group have started. Each
check is the function that loading itself calls, so the message is the same either way. Cheap:
no torch or transformers import.
"""

from __future__ import annotations

from typing import Any


def preflight(cfg: Any) -> None:
    """Raise the `graft.errors.GraftError` that loading ``cfg``'s model directory
    (``model.path``), tokenizer directory (``data.tokenizer``) or dataset files (``data.path``
    for ``data.source=file``, ``data.val_path``) would raise, in the order a run loads them."""
    from graft.data.files import dataset_file, training_file
    from graft.data.tokenizer import tokenizer_dir
    from graft.models.build import model_dir

    if cfg.model.path:
        model_dir(cfg.model.path)
    if cfg.data.tokenizer:
        tokenizer_dir(cfg.data.tokenizer)
    path = training_file(cfg.data)
    if path is not None:
        dataset_file(path, "data.path")
    if cfg.data.val_path:
        dataset_file(cfg.data.val_path, "data.val_path")
