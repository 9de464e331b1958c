"""The gradient does not depend on how a mini-batch is split over ranks and micro-batches."""

from __future__ import annotations

from pathlib import Path

import pytest

from graft.losses import BUILTIN_AGG_MODES
from graft.testing.invariance import (
    assert_modes_differ,
    assert_same_gradients,
    gradients_of_splits,
)

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "aggregation_grads.py"


@pytest.fixture(scope="module")
def gradients(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return gradients_of_splits(SCRIPT, tmp_path_factory.mktemp("aggregation"))


@pytest.mark.slow
@pytest.mark.parametrize("mode", BUILTIN_AGG_MODES)
def test_one_rank_four_micro_batches_equals_two_ranks_one_each(gradients, mode: str) -> None:
    assert_same_gradients(*gradients, mode)


def test_modes_give_different_gradients(gradients) -> None:
    assert_modes_differ(gradients[0], "lm_head.weight")
