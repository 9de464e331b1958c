"""graft-graphed-decode: Graft's own decode loop for the embedded engine's static copy (entry
point ``graphed_decode``, section ``features.graphed_decode``, `GraphedDecodeConfig`).

- `graft_graphed_decode.plugin`: where the plugin touches Graft's core (its section and
  ``graft_static_decoder``);
- `graft_graphed_decode.decoder`: `GraphedDecoder`, the loop (the decode step replayed from a
  CUDA graph, finished rows dropped) and `decodes_with_graphs`, the models it runs;
- `graft_graphed_decode.decode_attention`: the grouped-query attention of its SDPA steps;
- `graft_graphed_decode.regional_compile`: one inductor graph for every decoder block's decode
  step (``fuse_kernels``);
- `graft_graphed_decode.capturable`: which MoE experts a CUDA graph cannot capture.

Importing this package is cheap (no torch); `GraphedDecoder` and `decodes_with_graphs` are
loaded on first access.
"""

from graft import lazy_attributes
from graft_graphed_decode.config import GraphedDecodeConfig

__version__ = "0.1.0"

_LAZY = {
    "GraphedDecoder": "graft_graphed_decode.decoder",
    "decodes_with_graphs": "graft_graphed_decode.decoder",
}

__all__ = ["GraphedDecodeConfig", "__version__", *_LAZY]

__getattr__ = lazy_attributes(__name__, _LAZY)
