"""Policy losses and loss aggregation, as registries that plugins extend.

Submodules: `graft.losses.policy` (PPO clip, SFT NLL), `graft.losses.gspo` (GSPO),
`graft.losses.aggregation` (the ``loss_agg_mode`` formulas and `AggregationContext`),
`graft.losses.registry` (lookups through the plugin hooks), `graft.losses.separable` (the
`token_separable` mark). This package module imports nothing heavy.
"""

from graft.losses.modes import BUILTIN_AGG_MODES
from graft.losses.separable import is_token_separable, token_separable

__all__ = ["BUILTIN_AGG_MODES", "is_token_separable", "token_separable"]
