"""Packing samples into one row gives the same log-probs and gradients as running them alone."""

from __future__ import annotations

import pytest

from graft.config import ModelConfig
from graft.engine.batch.micro_batch import layout_rows
from graft.models import build_model
from graft.testing.families import check_packing

PRESETS = ["tiny-llama", "tiny-qwen3-moe", "tiny-deepseek-v3"]  # plugins check their own


@pytest.mark.parametrize("max_row_tokens", [None, 40])
@pytest.mark.parametrize("preset", PRESETS)
def test_packed_equals_unpacked(preset: str, max_row_tokens: int | None) -> None:
    model, family = build_model(ModelConfig(preset=preset), seed=0)
    check_packing(model, family, max_row_tokens=max_row_tokens)


def test_rows_of_bounded_length_keep_sample_order() -> None:
    layout = layout_rows([23, 9, 31, 14, 60], packs_sequences=True, pad_bucket=None,
                         max_row_tokens=40)
    assert [s.sample for s in layout.segments] == [0, 1, 2, 3, 4]
    per_row: dict[int, int] = {}
    for segment in layout.segments:
        per_row[segment.row] = per_row.get(segment.row, 0) + segment.length
    assert sorted(per_row.values()) == [37, 40, 60]  # 60 alone; 31 + 9; 23 + 14
    assert layout.num_rows == 3 and layout.row_length == 60
    one_row = layout_rows([23, 9], packs_sequences=True, pad_bucket=None, max_row_tokens=40)
    assert one_row.num_rows == 1 and [s.start for s in one_row.segments] == [0, 23]
