"""Packing samples into one row gives the same log-probs and gradients as running them alone."""

from __future__ import annotations

import pytest

from graft.config import ModelConfig
from graft.models import build_model
from graft.testing.families import check_packing

PRESETS = ["tiny-llama", "tiny-qwen3-moe", "tiny-deepseek-v3"]  # plugins check their own


@pytest.mark.parametrize("preset", PRESETS)
def test_packed_equals_unpacked(preset: str) -> None:
    model, family = build_model(ModelConfig(preset=preset), seed=0)
    check_packing(model, family)
