"""The ``features.graphed_decode`` config section (no torch: imported by every command)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SECTION = "graphed_decode"


@dataclass
class GraphedDecodeConfig:
    """``features.graphed_decode``: Graft's own decode loop for the embedded engine's static
    copy (``rollout.decode=static`` with ``rollout.decode_compile=cudagraphs``, both what `auto`
    picks on CUDA)."""

    # The static copy samples with this plugin's loop (graft_graphed_decode.decoder): the decode
    # step replayed from a CUDA graph (eager on CPU), finished rows dropped from the batch, the
    # trainer's numerics; its KV cache (batch x (prompt + max_new_tokens) keys and values per
    # layer, the smaller batches' its first rows) and graphs stay allocated between rollouts.
    # Models it cannot run (sliding-window attention, no static cache), and false: transformers'
    # compiled step (rollout.decode_compile). Only with rollout.decode_compile=cudagraphs.
    enabled: bool = True
    # On GPU: compile each decoder block's decode step with inductor before capturing it,
    # rounding wherever the eager ops round (emulate_precision_casts); GEMMs and attention stay
    # the eager kernels. Faster than the eager kernels (bench/README.md). One graph for every
    # decoder block (graft_graphed_decode.regional_compile), kept in the compile cache.
    # false: capture the eager kernels. graft-exact turns it off by default.
    fuse_kernels: bool = True


def graphed_decode_section(cfg: Any) -> GraphedDecodeConfig:
    """``cfg.features.graphed_decode`` of ``cfg`` (the root config), or the defaults for a
    config composed without this plugin's section or none at all (a decoder built outside a
    run)."""
    section = getattr(getattr(cfg, "features", None), SECTION, None)
    return GraphedDecodeConfig() if section is None else section
