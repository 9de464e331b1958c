"""Policy losses and loss aggregation, as registries that plugins extend.

For plugins: `AggregationContext` (the normalisers a ``graft_loss_aggregate`` gets as ``ctx``),
`aggregate_loss` (a micro-batch's loss matrix reduced through ``graft_loss_aggregate``, as the
trainer does it: plugins first, then the core's modes), `BUILTIN_AGG_MODES`, and the
`token_separable` mark (`is_token_separable`).

Submodules: `graft.losses.policy` (PPO clip, SFT NLL; plugins add losses: graft-gspo's GSPO),
`graft.losses.aggregation` (the ``loss_agg_mode`` formulas), `graft.losses.registry` (lookups
through the plugin hooks), `graft.losses.contract` (the torch-free names above). This package
module imports nothing heavy (torch loads when a loss is aggregated).
"""

from graft.losses.contract import (
    BUILTIN_AGG_MODES,
    AggregationContext,
    is_token_separable,
    token_separable,
)
from graft.losses.registry import aggregate_loss

__all__ = ["BUILTIN_AGG_MODES", "AggregationContext", "aggregate_loss", "is_token_separable",
           "token_separable"]
