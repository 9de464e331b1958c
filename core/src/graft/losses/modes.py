"""The built-in ``loss.loss_agg_mode`` names and the context every mode reduces with (formulas:
`graft.losses.aggregation`). No torch import: config validation reads this module."""

from __future__ import annotations

from dataclasses import dataclass

BUILTIN_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean",
                     "seq-mean-token-sum-norm")


@dataclass(frozen=True)
class AggregationContext:
    """Mini-batch-wide normalisers a ``graft_loss_aggregate`` gets as ``ctx`` (already
    all-reduced over data-parallel ranks and micro-batches): valid tokens ``global_tokens`` and
    non-empty sequences ``global_sequences`` of the mini-batch, the data-parallel size
    ``dp_size`` and the constant ``loss_scale_factor`` (``C`` of ``seq-mean-token-sum-norm``)."""

    global_tokens: float
    global_sequences: float
    dp_size: int
    loss_scale_factor: float
