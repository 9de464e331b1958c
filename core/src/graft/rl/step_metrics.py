"""An RL step's metrics over the data-parallel ranks: its rollouts' rewards, lengths and
timings, and how far the rollout's log-probs are from the trainer's."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.distributed as dist

from graft.engine.batch.micro_batch import MicroBatch
from graft.engine.distributed.env import DistEnv, all_reduce
from graft.rl.experience import is_truncated
from graft.rollout.types import RolloutSample

MISMATCH = "train_infer_logprob_diff"
# share of response tokens whose rollout log-prob equals the trainer's bit for bit
EXACT_FRACTION = "train_infer_logprob_exact_fraction"


def mismatch_metrics(batches: list[MicroBatch], env: DistEnv) -> dict[str, float]:
    """Mean |old - rollout| log-prob per response token and the share of those tokens where
    the two are bit-equal, over all data-parallel ranks (weighted by the loss mask)."""
    diff_sum = equal = count = 0.0
    for batch in batches:
        mask = batch.tensors["loss_mask"]
        old, rollout = batch.tensors["old_logprobs"], batch.tensors["rollout_logprobs"]
        # `where`, not `* mask`: whatever the pad holds cannot reach the sum (inf * 0 = nan).
        diff = torch.where(mask != 0, (old - rollout).abs() * mask, 0.0)
        diff_sum += float(diff.sum())
        equal += float(torch.where(mask != 0, (old == rollout) * mask, 0.0).sum())
        count += float(mask.sum())
    totals = all_reduce(torch.tensor([diff_sum, equal, count], dtype=torch.float64,
                                     device=env.device), group=env.dp_group)
    tokens = max(float(totals[2]), 1.0)
    return {MISMATCH: float(totals[0]) / tokens, EXACT_FRACTION: float(totals[1]) / tokens}


def rollout_metrics(samples: Sequence[RolloutSample], rewards: torch.Tensor, *, env: DistEnv,
                    rollout_s: float, update_s: float, max_new_tokens: int,
                    eos_token_id: int | None) -> dict[str, float]:
    """The step's rewards, lengths (tokens; a response's counts its environment tokens) and
    timings (seconds) over all data-parallel ranks; ``response_truncated_fraction`` is the
    share of responses cut at ``max_new_tokens`` (their last model turn: no ``eos``)."""
    lengths = [len(s.response_ids) for s in samples]
    truncated = sum(is_truncated(s, max_new_tokens=max_new_tokens, eos_token_id=eos_token_id)
                    for s in samples)
    stats = all_reduce(torch.tensor(
        [float(rewards.sum()), float(rewards.square().sum()), float(len(samples)),
         float(sum(lengths)), float(sum(len(s.prompt_ids) for s in samples)), float(truncated)],
        dtype=torch.float64, device=env.device), group=env.dp_group)
    # max of the lengths and of their negatives: the longest and the shortest response
    extremes = all_reduce(torch.tensor(
        [max(lengths, default=-math.inf), -min(lengths, default=math.inf)],
        dtype=torch.float64, device=env.device), op=dist.ReduceOp.MAX, group=env.dp_group)
    total, squares, count, generated, prompted, cut = (float(v) for v in stats)
    count = max(count, 1.0)
    mean = total / count
    longest, shortest = (float(v) if math.isfinite(v) else 0.0
                         for v in (extremes[0], -extremes[1]))
    return {"reward_mean": mean,
            "reward_std": max(squares / count - mean * mean, 0.0) ** 0.5,
            "response_length": generated / count, "response_length_max": longest,
            "response_length_min": shortest, "response_truncated_fraction": cut / count,
            "prompt_length": prompted / count, "rollout_s": rollout_s,
            "update_s": update_s, "rollout_tokens_per_s": generated / max(rollout_s, 1e-9)}
