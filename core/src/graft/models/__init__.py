"""Model families, presets and model building.

For model plugins: `ModelFamily`, `preset_config` (a tiny preset's config on the built-in
tokenizer's vocabulary) and `routers_at` (the routers of every MoE layer at ``layer.mlp.<name>``).
"""

from graft.models.build import build_model
from graft.models.builtin import preset_config, routers_at
from graft.models.family import ModelFamily
from graft.models.registry import family_for, model_families, presets

__all__ = ["ModelFamily", "build_model", "family_for", "model_families", "preset_config",
           "presets", "routers_at"]
