"""graft-graphed-decode's hooks (no torch here: Graft imports this module for every command):
its config section, and the decoder the embedded engine's static copy samples with."""

from __future__ import annotations

from typing import Any

from graft import hookimpl
from graft_graphed_decode.config import SECTION, GraphedDecodeConfig, graphed_decode_section


@hookimpl
def graft_config_sections() -> list[tuple[str, type]]:
    """``features.graphed_decode`` (`GraphedDecodeConfig`)."""
    return [(SECTION, GraphedDecodeConfig)]


@hookimpl
def graft_static_decoder(model: Any, pad_token_id: int, eos_token_id: int | None, device: Any,
                         decode_compile: str, cfg: Any) -> Any:
    """A `graft_graphed_decode.decoder.GraphedDecoder` for the static copy ``model`` when
    ``features.graphed_decode.enabled``, ``rollout.decode_compile=cudagraphs`` and the model
    suits it (`decodes_with_graphs`): CUDA graphs and fused kernels (``fuse_kernels``) on a CUDA
    ``device``, the same step eagerly elsewhere. None otherwise: transformers' ``generate``
    decodes."""
    section = graphed_decode_section(cfg)
    if not section.enabled or decode_compile != "cudagraphs":
        return None
    from graft_graphed_decode.decoder import GraphedDecoder, decodes_with_graphs

    if not decodes_with_graphs(model):
        return None
    on_gpu = device.type == "cuda"
    return GraphedDecoder(model, pad_token_id=pad_token_id, eos_token_id=eos_token_id,
                          use_graphs=on_gpu, fuse_kernels=section.fuse_kernels and on_gpu,
                          cfg=cfg)
