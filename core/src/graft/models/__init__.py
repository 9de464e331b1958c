"""Model families, presets and model building.

For model plugins: `ModelFamily`, `preset_config` (a tiny preset's config on the built-in
tokenizer's vocabulary), `routers_at` (the routers of every MoE layer at ``layer.mlp.<name>``),
`BUILTIN_FAMILIES` (the core's own families, for a plugin that replaces one with a variant:
``dataclasses.replace(core_family, ...)``; `family_for` would call the plugin's own hook),
`family_for` (the family of a ``model_type``, plugins' included) and `cache_argument`,
`cache_keyword`, `passed_cache` (a model's KV-cache keyword, ``past_key_values`` or ``cache``,
on the installed transformers: `graft.models.kv_cache`; `CACHE_KEYWORDS`, both, the current
first); `resolve_config` (the Hugging Face config a ``model`` section describes, preset or local
directory, without building the model: for config rules that depend on the model).
"""

from graft.models.build import build_model, resolve_config
from graft.models.builtin import BUILTIN_FAMILIES, preset_config, routers_at
from graft.models.family import ModelFamily
from graft.models.kv_cache import CACHE_KEYWORDS, cache_argument, cache_keyword, passed_cache
from graft.models.registry import family_for, model_families, presets

__all__ = ["BUILTIN_FAMILIES", "CACHE_KEYWORDS", "ModelFamily", "build_model", "cache_argument",
           "cache_keyword", "family_for", "model_families", "passed_cache", "preset_config",
           "presets", "resolve_config", "routers_at"]
