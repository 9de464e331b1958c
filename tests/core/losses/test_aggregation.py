"""The loss_agg_mode formulas on a hand-checked example."""

from __future__ import annotations

import pytest
import torch

from graft.errors import ConfigError
from graft.losses.aggregation import AggregationContext, aggregate_builtin
from graft.losses.registry import aggregate_loss

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 0.0], [7.0, 8.0, 9.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
# masked sums per sequence: 6, 4, 0 (third sequence is empty); token counts 3, 1, 0
CTX = AggregationContext(global_tokens=8.0, global_sequences=4.0, dp_size=2,
                         loss_scale_factor=5.0)


@pytest.mark.parametrize(("mode", "expected"), [
    ("token-mean", 2 * 10 / 8),
    ("token-sum", 2 * 10),
    ("seq-mean-token-sum", 2 * 10 / 4),
    ("seq-mean-token-mean", 2 * (6 / 3 + 4 / 1) / 4),
    ("seq-mean-token-sum-norm", 2 * 10 / 5 / 4),
])
def test_builtin_modes(mode: str, expected: float) -> None:
    assert aggregate_builtin(LOSS, MASK, mode, CTX).item() == pytest.approx(expected)


def test_unknown_mode_is_a_config_error_listing_modes() -> None:
    with pytest.raises(ConfigError, match="valid modes: token-mean, token-sum"):
        aggregate_loss(LOSS, MASK, "token-avg", CTX)
