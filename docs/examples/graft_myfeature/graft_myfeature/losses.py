"""A loss aggregation mode: declared by graft_loss_agg_modes, computed by graft_loss_aggregate."""

from graft import hookimpl

MODE = "seq-sum-token-mean"


@hookimpl
def graft_loss_agg_modes():
    return [MODE]                                # now loss.loss_agg_mode accepts it


@hookimpl
def graft_loss_aggregate(loss_mat, loss_mask, mode, ctx):
    if mode != MODE:
        return None                              # not ours: the next plugin, then the core
    # One micro-batch's share: summed over micro-batches and averaged over the ctx.dp_size
    # ranks, it is the sum over the mini-batch's sequences of each one's mean token loss.
    per_sequence = (loss_mat * loss_mask).sum(-1) / loss_mask.sum(-1).clamp(min=1)
    return per_sequence.sum() * ctx.dp_size
