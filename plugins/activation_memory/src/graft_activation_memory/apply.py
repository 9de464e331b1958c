"""Applying ``features.activation_memory`` to a model, through its model family's adapters."""

from __future__ import annotations

import logging

import torch

from graft.models import family_for
from graft_activation_memory.config import ActivationMemoryConfig
from graft_activation_memory.recomputed_norms import apply_recomputed_norms, final_norm
from graft_activation_memory.tiled_mlp import apply_tiled_mlp

logger = logging.getLogger("graft_activation_memory")


def apply_activation_memory(model: torch.nn.Module, section: ActivationMemoryConfig) -> None:
    """Tile the dense MLPs of ``model``'s decoder blocks (``section.mlp_chunk_tokens`` > 0;
    MLPs holding one of the family's ``router_modules`` stay whole) and make the blocks' and
    the final norms recompute in backward (``section.recompute_norms``), in place. The blocks
    are the model family's ``decoder_blocks`` (`graft.models.family_for` the model's
    ``config.model_type``), so a plugin's family takes part as the core's do."""
    family = family_for(getattr(getattr(model, "config", None), "model_type", ""))
    blocks = list(family.decoder_blocks(model))
    if section.mlp_chunk_tokens:
        routers = family.router_modules(model) if family.router_modules else ()
        tiled = apply_tiled_mlp(blocks, section.mlp_chunk_tokens, routers)
        logger.debug("mlp_chunk_tokens=%d: %d dense MLPs tiled", section.mlp_chunk_tokens, tiled)
    if section.recompute_norms:
        apply_recomputed_norms([*blocks, *final_norm(model)])
