"""What a loss plugin works with, no torch imported (config validation reads it): the built-in
``loss.loss_agg_mode`` names and the context every mode reduces with (formulas:
`graft.losses.aggregation`), and the mark of a token-separable loss.

A token-separable loss is a per-token loss whose value at a token depends on that token's
inputs alone (its log-prob and the batch tensors at its position), never on another token's.
PPO's clipped surrogate, the KL penalty and SFT's NLL are; a sequence-ratio loss (graft-gspo's
GSPO) is not. For a token-separable loss and a linear aggregation (every built-in
``loss.loss_agg_mode``), the gradient of the micro-batch's loss with respect to a token's
log-prob is known as soon as that token's log-prob is: the chunked head then takes the loss's
gradient in its forward (`graft.engine.head.fused_loss`) and never recomputes the logits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

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


LossCallable = TypeVar("LossCallable", bound=Callable[..., Any])
_MARK = "graft_token_separable"


def token_separable(loss: LossCallable) -> LossCallable:
    """Mark ``loss`` (a policy loss or a ``loss_fn`` of `TrainEngine.forward_backward`) as
    token-separable; returns it unchanged. Mark only what really is: a loss that mixes tokens
    (a sequence mean, a sequence ratio) would get wrong gradients on the fused path."""
    setattr(loss, _MARK, True)
    return loss


def is_token_separable(loss: Callable[..., Any]) -> bool:
    """True when ``loss`` was marked with `token_separable`."""
    return bool(getattr(loss, _MARK, False))
