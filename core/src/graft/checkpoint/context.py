"""`LoadContext`: what ``graft_ckpt_load`` implementations know about the checkpoint being loaded."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class LoadContext:
    """The checkpoint being loaded and the fresh state it is merged into.

    Attributes:
        path: the checkpoint folder (``.../checkpoints/step_<N>``).
        step: the training step it was saved after.
        saved_world_size: the number of ranks that saved it.
        checkpoint_keys: every key stored in it (DCP flat keys: ``model.<fqn>``,
            ``optim.state.<fqn>.<name>``, ``optim.param_groups.<fqn>.<name>``).
        fresh_optimizer_state: the flattened optimizer entries (keys ``state.<fqn>.<name>``) the
            checkpoint lacks, as a new optimizer creates them on this rank.
        backfilled: optimizer keys filled from ``fresh_optimizer_state`` (set by the core).
    """

    path: Path
    step: int
    saved_world_size: int
    checkpoint_keys: frozenset[str]
    fresh_optimizer_state: dict[str, Any]
    backfilled: list[str] = field(default_factory=list)
