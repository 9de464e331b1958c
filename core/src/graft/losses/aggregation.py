"""Loss aggregation: the five built-in ``loss.loss_agg_mode`` formulas, with global normalisers.

With ``l`` the per-token loss and ``m`` the mask of a micro-batch's ``(S, T)`` matrices, ``N`` the
number of valid tokens and ``B`` the number of non-empty sequences in the whole mini-batch (all
data-parallel ranks, all micro-batches), ``dp`` the data-parallel size and ``C`` the constant
``loss_scale_factor`` (default: the padded response length), one micro-batch contributes

* ``token-mean``:              dp * sum_{i,t} m l / N
* ``token-sum``:               dp * sum_{i,t} m l
* ``seq-mean-token-sum``:      dp * sum_i (sum_t m l) / B
* ``seq-mean-token-mean``:     dp * sum_i (sum_t m l / sum_t m) / B
* ``seq-mean-token-sum-norm``: dp * sum_i (sum_t m l) / C / B   (Dr. GRPO)

Summed over micro-batches and averaged over ranks by FSDP's gradient reduction, these give the
mode's value over the mini-batch, so the gradient does not depend on how the mini-batch was
split. Sequences with no valid token contribute nothing and are not counted in ``B``.
"""

from __future__ import annotations

from typing import Any

import torch

from graft.losses.contract import AggregationContext


def loss_scale_factor(cfg: Any) -> float:
    """``C`` of ``seq-mean-token-sum-norm``: ``loss.loss_scale_factor``, or when null the run's
    response token cap (``rollout.max_new_tokens`` in RL, ``data.max_response_tokens``
    otherwise), which is the padded response length of the formula. One source for every job."""
    if cfg.loss.loss_scale_factor is not None:
        return float(cfg.loss.loss_scale_factor)
    cap = cfg.rollout.max_new_tokens if cfg.trainer.mode == "rl" else cfg.data.max_response_tokens
    return float(cap)


def aggregate_builtin(loss_mat: torch.Tensor, loss_mask: torch.Tensor, mode: str,
                      ctx: AggregationContext) -> torch.Tensor:
    """The scalar a micro-batch contributes under built-in ``mode`` (formulas above)."""
    # `where`, not only `* mask`: a NaN or inf at a masked position (a pad, an empty answer)
    # must not reach the sum (inf * 0 = nan).
    masked = torch.where(loss_mask != 0, loss_mat * loss_mask, 0.0)
    tokens = max(ctx.global_tokens, 1.0)
    sequences = max(ctx.global_sequences, 1.0)
    if mode == "token-mean":
        total = masked.sum() / tokens
    elif mode == "token-sum":
        total = masked.sum()
    elif mode == "seq-mean-token-sum":
        total = masked.sum() / sequences
    elif mode == "seq-mean-token-mean":
        per_sequence = masked.sum(-1) / loss_mask.sum(-1).clamp(min=1.0)
        total = per_sequence.sum() / sequences
    elif mode == "seq-mean-token-sum-norm":
        total = masked.sum() / ctx.loss_scale_factor / sequences
    else:
        raise ValueError(f"not a built-in loss_agg_mode: {mode!r}")
    return total * ctx.dp_size
