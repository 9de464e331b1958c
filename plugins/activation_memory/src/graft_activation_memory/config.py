"""The ``features.activation_memory`` config section (no torch: imported by every command)."""

from __future__ import annotations

from dataclasses import dataclass

from graft.config import bounded


@dataclass
class ActivationMemoryConfig:
    """``features.activation_memory``: keep less of the trained model's activations for backward,
    at the cost of recomputing them there (the same results: see the plugin's README)."""

    # Run each dense decoder MLP on this many tokens at a time in training, recomputing each
    # chunk in backward, so a block's backward never holds its tokens x intermediate_size
    # activations (graft_activation_memory.tiled_mlp); 0: the whole sequence at once. MoE
    # layers stay whole.
    mlp_chunk_tokens: int = bounded(0, ge=0, note="0: the MLP over the whole sequence")
    # Recompute each decoder block's norms (RMSNorm/LayerNorm) and the final norm in backward
    # instead of keeping their fp32 intermediates: a norm then keeps only its input
    # (graft_activation_memory.recomputed_norms); the same values (fp32 gradients within
    # rounding), one more norm forward in backward.
    recompute_norms: bool = False
