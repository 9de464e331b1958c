"""A micro-batch's loss as a sum over its tokens, for the fused head
(`graft.engine.head.fused_loss`, ``engine.fuse_loss_into_head``).

With a token-separable ``loss_fn`` (`graft.losses.contract`) and a built-in (linear)
``loss_agg_mode``, the micro-batch's aggregated loss is ``sum_t w_t loss_t``: the weights ``w``
are the aggregation's gradient with respect to the per-token loss, taken once per micro-batch
by autograd through the same `aggregate_loss` and `MicroBatch.to_sequences` the unfused path
uses, so each token's loss gradient is the one the unfused path gives it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from graft.engine.batch.micro_batch import MicroBatch
from graft.engine.head.fused_loss import TokenLoss
from graft.losses.aggregation import AggregationContext
from graft.losses.contract import is_token_separable
from graft.losses.registry import aggregate_loss, builtin_aggregation

# Tensors of the grid the loss never sees (as in TrainEngine.forward_backward).
MODEL_INPUTS = ("input_ids", "labels", "position_ids")

# loss_fn(logp, tensors, mask) -> (loss_mat, per-token metrics); all (S, T) fp32 matrices
# (the loss of `TrainEngine.forward_backward`).
LossFn = Callable[[torch.Tensor, Mapping[str, torch.Tensor], torch.Tensor],
                  tuple[torch.Tensor, dict[str, torch.Tensor]]]


def fuses_loss(loss_fn: LossFn, mode: str, *, enabled: bool, chunk_tokens: int) -> bool:
    """True when the head can take ``loss_fn``'s gradient in its forward: the setting is on,
    the log-probs are chunked, the loss is token-separable and ``mode`` is a built-in one."""
    return (enabled and chunk_tokens > 0 and is_token_separable(loss_fn)
            and builtin_aggregation(mode))


def token_weights(batch: MicroBatch, mode: str, ctx: AggregationContext) -> torch.Tensor:
    """``(R, L)`` fp32: each grid position's weight in the micro-batch's aggregated loss (zero
    off the loss mask and on pads)."""
    grid_mask = batch.tensors["loss_mask"]
    with torch.enable_grad():
        grid = torch.zeros(grid_mask.shape, dtype=torch.float32, device=grid_mask.device,
                           requires_grad=True)
        total = aggregate_loss(batch.to_sequences(grid), batch.to_sequences(grid_mask), mode, ctx)
        (weights,) = torch.autograd.grad(total, grid, allow_unused=True)
    return torch.zeros_like(grid) if weights is None else weights


def chunk_token_loss(loss_fn: LossFn, batch: MicroBatch, weights: torch.Tensor) -> TokenLoss:
    """The `TokenLoss` of ``loss_fn`` on ``batch``: for a slice of flat grid positions and their
    log-probs, ``sum w_t loss_t`` over them, ``loss_fn`` called on them as one ``(1, n)``
    sequence (its metrics are dropped; the engine computes them on the whole batch)."""
    grid = batch.tensors["loss_mask"].shape
    count = grid.numel()
    flat = {name: tensor.reshape(count, *tensor.shape[len(grid):])
            for name, tensor in batch.tensors.items()
            if name not in MODEL_INPUTS and tensor.shape[:len(grid)] == grid}
    flat_weights = weights.reshape(count)
    flat_mask = flat["loss_mask"]

    def token_loss(tokens: slice, logp: torch.Tensor) -> torch.Tensor:
        kept = flat_mask[tokens] != 0
        # off the mask (prompt, pad) every input is 0, as `to_sequences` makes a pad's: the
        # loss there must stay finite so its zero weight gives a zero gradient
        tensors = {name: _where(kept, values[tokens])[None] for name, values in flat.items()}
        loss_mat, _ = loss_fn(_where(kept, logp)[None], tensors, tensors["loss_mask"])
        return torch.where(kept, loss_mat[0] * flat_weights[tokens], 0.0).sum()

    return token_loss


def _where(kept: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    mask = kept.reshape(*kept.shape, *([1] * (values.dim() - 1)))
    return torch.where(mask, values, torch.zeros((), dtype=values.dtype, device=values.device))
