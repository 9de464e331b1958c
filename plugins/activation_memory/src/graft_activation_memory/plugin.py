"""graft-activation-memory's hooks (no torch here: Graft imports this module for every
command): its config section, and the policy model's MLPs and norms replaced before sharding."""

from __future__ import annotations

from typing import Any

from graft import hookimpl
from graft_activation_memory.config import ActivationMemoryConfig

SECTION = "activation_memory"


@hookimpl
def graft_pre_shard(model: Any, cfg: Any, role: str) -> None:
    """Tile the policy's dense MLPs and make its norms recompute in backward, as
    ``features.activation_memory`` says (after activation checkpointing, before FSDP2; the
    model may still be on the meta device). The frozen reference, never differentiated, is
    left alone."""
    section = getattr(cfg.features, SECTION)
    if role == "policy" and (section.mlp_chunk_tokens or section.recompute_norms):
        from graft_activation_memory.apply import apply_activation_memory

        apply_activation_memory(model, section)


@hookimpl
def graft_config_sections() -> list[tuple[str, type]]:
    """``features.activation_memory`` (`ActivationMemoryConfig`)."""
    return [(SECTION, ActivationMemoryConfig)]
