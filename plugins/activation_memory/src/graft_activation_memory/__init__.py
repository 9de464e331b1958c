"""graft-activation-memory: less activation memory in training (entry point
``activation_memory``, section ``features.activation_memory``, `ActivationMemoryConfig`).

Importing this package is cheap (no torch). The torch-level functions live in their modules:
`graft_activation_memory.apply.apply_activation_memory` (the section applied to a model, as the
plugin's ``graft_pre_shard`` does), `graft_activation_memory.tiled_mlp.apply_tiled_mlp` (tile
given decoder blocks' dense MLPs by hand) and
`graft_activation_memory.recomputed_norms.apply_recomputed_norms` (make given modules' norms
recompute in backward).
"""

from graft_activation_memory.config import ActivationMemoryConfig

__version__ = "0.1.0"

__all__ = ["ActivationMemoryConfig", "__version__"]
