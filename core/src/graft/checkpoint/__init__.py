"""Distributed checkpoints: atomic DCP saves, verified loads, exact resume, resharding.

The package module imports nothing heavy; `graft.checkpoint.manager.CheckpointManager` does the
work (it imports torch). Here: `LoadContext`, what ``graft_ckpt_load`` implementations know about
the checkpoint being loaded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["LoadContext"]


@dataclass
class LoadContext:
    """The checkpoint being loaded, and what the ``graft_ckpt_load`` hooks decided.

    Attributes:
        path: the checkpoint folder (``.../checkpoints/step_<N>``).
        step: the training step it was saved after.
        saved_world_size: the number of ranks that saved it.
        checkpoint_keys: every key stored in it (DCP flat keys: ``model.<fqn>``,
            ``optim.state.<fqn>.<name>``, ``optim.param_groups.<fqn>.<name>``).
        keep_fresh: keys (same form) of live entries not to read: they keep the value a fresh
            model or optimizer has (hooks add to it; the core's backfill adds the optimizer
            entries of parameters the checkpoint has no state for).
        backfilled: the optimizer keys the core's backfill kept fresh (for messages and tests).
    """

    path: Path
    step: int
    saved_world_size: int
    checkpoint_keys: frozenset[str]
    keep_fresh: set[str] = field(default_factory=set)
    backfilled: list[str] = field(default_factory=list)
