"""Off-policy corrections of the policy-gradient loss (``algorithm.rollout_correction``).

The rollout engine samples with the behaviour policy, whose log-probs (``rollout_logprobs``)
differ from the trainer's old log-probs (``old_logprobs``) by the train-inference mismatch, and
later by the policy lag. A correction turns the ratio ``r = exp(old - rollout)`` of each response
token into a detached weight that multiplies the per-token policy loss (not the KL penalty):

* ``tis``: truncated IS (slime ``--use-tis``), ``w = min(r, C)``;
* ``mis``: masked IS per token (TRL's ``token_mask``), ``w = r`` where ``r <= C``, else 0;
* ``seq_mis``: masked IS per sequence (TRL's ``sequence_mask``): the sequence ratio
  ``R = exp(sum over its tokens of (old - rollout))``; every token gets ``R`` where ``R <= C``,
  else 0 (the whole sequence is masked);
* ``icepop``: IcePop (slime's ``icepop_function``), ``w = r`` where ``low <= r <= high``, else 0.

``C`` is ``algorithm.rollout_correction_cap``, ``low``/``high`` are ``algorithm.icepop_low`` and
``algorithm.icepop_high``. Each function takes ``(sequences, tokens)`` fp32 tensors and returns
the weights in that shape; plugins add theirs with ``graft_rollout_corrections``. The step
computes the weights once, after the old log-probs (`apply_correction`), so the loss stays
token-separable even for a sequence-level correction.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from graft.plugins import GraftPluginManager, get_plugin_manager
from graft.plugins.keywords import call_with_keywords
from graft.plugins.registry import collect_named

if TYPE_CHECKING:  # torch loads when a correction runs: the registry is read by every command
    import torch

    from graft.config.schema import AlgorithmConfig, GraftConfig
    from graft.engine.batch.micro_batch import MicroBatch
    from graft.engine.distributed.env import DistEnv

WEIGHTS = "rollout_is_weights"  # the micro-batch tensor the loss multiplies by
PREFIX = "rollout_correction/"
LOG_RATIO_CLAMP = 20.0  # exp(20) is finite in fp32; a NaN stays NaN


def log_ratio(old_logp: torch.Tensor, rollout_logp: torch.Tensor,
              mask: torch.Tensor) -> torch.Tensor:
    """``old - rollout`` per token, clamped to +-20, 0 off the mask (pad and prompt)."""
    import torch

    diff = (old_logp - rollout_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.where(mask != 0, diff, 0.0)


def tis(*, old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor,
        cfg: AlgorithmConfig) -> torch.Tensor:
    """Token-level truncated IS: ``min(exp(old - rollout), rollout_correction_cap)``."""
    return log_ratio(old_logp, rollout_logp, mask).exp().clamp(max=cfg.rollout_correction_cap)


def mis(*, old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor,
        cfg: AlgorithmConfig) -> torch.Tensor:
    """Token-level masked IS: the ratio, or 0 where it is above ``rollout_correction_cap``."""
    import torch

    ratio = log_ratio(old_logp, rollout_logp, mask).exp()
    return torch.where(ratio <= cfg.rollout_correction_cap, ratio, 0.0)


def seq_mis(*, old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor,
            cfg: AlgorithmConfig) -> torch.Tensor:
    """Sequence-level masked IS: each sequence's ratio ``exp(sum of old - rollout)`` on all its
    tokens, or 0 on all of them where it is above ``rollout_correction_cap``."""
    import torch

    total = log_ratio(old_logp, rollout_logp, mask).sum(-1, keepdim=True)
    ratio = total.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp().expand_as(mask)
    return torch.where(ratio <= cfg.rollout_correction_cap, ratio, 0.0)


def icepop(*, old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor,
           cfg: AlgorithmConfig) -> torch.Tensor:
    """IcePop: the token's ratio inside ``[icepop_low, icepop_high]``, 0 outside."""
    import torch

    ratio = log_ratio(old_logp, rollout_logp, mask).exp()
    return torch.where((ratio >= cfg.icepop_low) & (ratio <= cfg.icepop_high), ratio, 0.0)


def rollout_corrections(
        manager: GraftPluginManager | None = None) -> dict[str, Callable[..., Any]]:
    """Every rollout correction by name; two providers of one name is a `PluginError`."""
    return collect_named(manager or get_plugin_manager(), "graft_rollout_corrections",
                         "rollout correction")


def apply_correction(batches: Sequence[MicroBatch], fn: Callable[..., Any], env: DistEnv, *,
                     cfg: GraftConfig) -> dict[str, float]:
    """Store the weights of the correction ``fn`` (``algorithm.rollout_correction``'s, from
    `rollout_corrections`) in each micro-batch (``WEIGHTS``, a grid like the log-probs) and
    return its metrics over all data-parallel ranks.

    Needs ``old_logprobs`` and ``rollout_logprobs`` in every batch. A weight that is not finite
    (a plugin's, or a NaN log-prob) becomes 0 and is counted in ``nonfinite_fraction``: it never
    reaches the loss (rank 0 says so on the console). Metrics (prefix ``rollout_correction/``):
    ``weight_mean``/``max``/``min`` over response tokens, ``masked_fraction`` (tokens of weight
    0), ``truncated_fraction`` (tokens kept with a weight below their own ratio),
    ``seq_masked_fraction`` (sequences whose every token has weight 0) and
    ``nonfinite_fraction``.
    """
    import torch
    import torch.distributed as dist

    from graft.engine.distributed.env import all_reduce
    from graft.training.metrics import console_print

    # summed on the device and read once, after the all-reduce: no host sync per micro-batch
    sums = torch.zeros(7, dtype=torch.float64, device=env.device)  # weight, tokens, masked...
    extremes = torch.full((2,), -torch.inf, dtype=torch.float64, device=env.device)  # max, -min
    for batch in batches:
        mask = batch.to_sequences(batch.tensors["loss_mask"])
        old = batch.to_sequences(batch.tensors["old_logprobs"])
        rollout = batch.to_sequences(batch.tensors["rollout_logprobs"])
        weights = call_with_keywords(fn, old_logp=old, rollout_logp=rollout, mask=mask,
                                     cfg=cfg.algorithm, root_cfg=cfg).detach().float()
        valid = mask != 0
        finite = torch.isfinite(weights)
        weights = torch.where(valid & finite, weights, 0.0)
        ratio = log_ratio(old, rollout, mask).exp()
        kept = valid & finite
        sequences = valid.any(-1)
        counts = [weights.sum(), valid.sum(), (valid & (weights == 0)).sum(),
                  (kept & (weights > 0) & (weights < ratio)).sum(),
                  (sequences & ~(weights != 0).any(-1)).sum(), sequences.sum(),
                  (valid & ~finite).sum()]
        sums += torch.stack([c.to(sums) for c in counts])
        inf = torch.tensor(torch.inf, dtype=weights.dtype, device=weights.device)
        extremes = torch.maximum(extremes, torch.stack(
            [torch.where(valid, weights, -inf).max(), -torch.where(valid, weights, inf).min()]
        ).to(extremes))
        grid = torch.zeros(batch.tensors["loss_mask"].numel())
        grid[batch.sequence_index[batch.sequence_valid]] = weights[batch.sequence_valid]
        batch.tensors[WEIGHTS] = grid.reshape(batch.tensors["loss_mask"].shape)
    totals = all_reduce(sums, group=env.dp_group).tolist()
    top = all_reduce(extremes, op=dist.ReduceOp.MAX, group=env.dp_group).tolist()
    tokens, seqs = max(totals[1], 1.0), max(totals[5], 1.0)
    if totals[6] and env.is_main:
        console_print(f"rollout correction {cfg.algorithm.rollout_correction!r}: {totals[6]:.0f} "
                      f"response tokens got a non-finite weight; left out of this step's loss")
    return {f"{PREFIX}weight_mean": totals[0] / tokens,
            f"{PREFIX}weight_max": top[0] if totals[1] else 0.0,
            f"{PREFIX}weight_min": -top[1] if totals[1] else 0.0,
            f"{PREFIX}masked_fraction": totals[2] / tokens,
            f"{PREFIX}truncated_fraction": totals[3] / tokens,
            f"{PREFIX}seq_masked_fraction": totals[4] / seqs,
            f"{PREFIX}nonfinite_fraction": totals[6] / tokens}
