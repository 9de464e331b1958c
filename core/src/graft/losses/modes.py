"""The names of the built-in ``loss.loss_agg_mode`` values (formulas: `graft.losses.aggregation`)."""

BUILTIN_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean",
                     "seq-mean-token-sum-norm")
