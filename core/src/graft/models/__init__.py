"""Model families, presets and model building."""

from graft.models.build import build_model
from graft.models.family import ModelFamily
from graft.models.registry import family_for, model_families, presets

__all__ = ["ModelFamily", "build_model", "family_for", "model_families", "presets"]
