"""DAPO's shaping of an RL step's batch (arXiv 2503.14476): the pure functions (hand-checked in
tests/dapo/test_shaping.py) and `DapoShaper`, which applies them to a step with the collectives
the data-parallel ranks need (the core's `graft.rl.BatchShaper` protocol). torch is imported
where the math runs: importing this module is cheap."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from graft.rl import Experience, is_truncated, last_model_turn, merge_experiences
from graft_dapo.config import dapo_section

if TYPE_CHECKING:
    import torch

    from graft.engine import DistEnv
    from graft.rollout import RolloutSample

SAMPLING = "dynamic_sampling/"
OVERLONG = "overlong/"


def overlong_penalty(lengths: Sequence[int], *, max_new_tokens: int, buffer: int,
                     penalty: float) -> torch.Tensor:
    """DAPO's soft overlong punishment per response (float64, <= 0): 0 up to
    ``max_new_tokens - buffer`` tokens, then falling linearly to ``-penalty`` at
    ``max_new_tokens`` (and staying there beyond). ``lengths`` in tokens."""
    import torch

    start = max_new_tokens - buffer
    over = (torch.tensor(list(lengths), dtype=torch.float64) - start).clamp(0.0, float(buffer))
    return -penalty * over / buffer


def flat_groups(rewards: torch.Tensor, group_size: int) -> list[bool]:
    """Per group of ``group_size`` consecutive rewards, whether they are all equal (exactly:
    the advantage estimators give such a group advantage 0)."""
    groups = rewards.reshape(-1, group_size)
    return (groups == groups[:, :1]).all(dim=1).tolist()


def plan_groups(kept: Sequence[bool], *, batch: int, multiple: int) -> tuple[list[int], list[int]]:
    """Which groups (positions in draw order) a step trains on: the first ``batch`` of those
    ``kept``; when fewer were kept, the earliest dropped ones pad the count to a multiple of
    ``multiple`` (the data-parallel size; at least one group per rank), to be trained with loss
    mask 0. Returns (trained, padding), each in draw order."""
    chosen = [i for i, keep in enumerate(kept) if keep][:batch]
    size = max(multiple, -(-len(chosen) // multiple) * multiple)
    padding = [i for i, keep in enumerate(kept) if not keep][:size - len(chosen)]
    return chosen, padding


def masked(sample: RolloutSample) -> RolloutSample:
    """A copy of ``sample`` with loss mask 0 on every response token (no gradient, no tokens in
    the loss normalisers)."""
    import torch

    return dataclasses.replace(sample, loss_mask=torch.zeros(len(sample.response_ids)))


def take_groups(experience: Experience, groups: Sequence[int], group_size: int) -> Experience:
    """The groups ``groups`` (positions among the experience's prompts) of ``experience``, in
    that order; its seconds and metrics unchanged."""
    rows = [g * group_size + k for g in groups for k in range(group_size)]
    versions = experience.policy_versions
    return dataclasses.replace(
        experience, prompt_indices=[experience.prompt_indices[g] for g in groups],
        texts=[experience.texts[r] for r in rows], samples=[experience.samples[r] for r in rows],
        rewards=experience.rewards[rows],
        policy_versions=None if versions is None else [versions[r] for r in rows])


class DapoShaper:
    """Applies ``features.dapo`` (dynamic sampling, the overlong filter or penalty) to each RL
    step's experience on every data-parallel rank (the ranks run the same collectives), from
    the root config ``cfg``; ``eos_token_id`` ends a response that was not truncated."""

    def __init__(self, cfg: Any, env: DistEnv, eos_token_id: int | None) -> None:
        self.cfg, self.env, self.eos_token_id = cfg, env, eos_token_id
        dapo = self.dapo = dapo_section(cfg)
        self.dynamic = bool(dapo.dynamic_sampling)
        self.overlong = dapo.overlong
        buffer = dapo.overlong_buffer
        self.buffer = buffer if buffer is not None else max(1, cfg.rollout.max_new_tokens // 5)

    @property
    def active(self) -> bool:
        """Whether anything is shaped (else `shape` returns the first draw as it is)."""
        return self.dynamic or self.overlong != "none"

    def shape(self, draw: Callable[[], Experience], *,
              refill: bool) -> tuple[Experience, dict[str, float]]:
        """This rank's share of the step's shaped experience and the shaping's metrics.

        ``draw()``: this rank's share of one more round (a fresh draw of
        ``rollout.prompts_per_step`` prompts, ``rollout.n`` samples each; every rank calls it
        the same number of times). ``refill``: draw again while fewer groups than
        ``rollout.prompts_per_step`` are kept (the colocated mode; a plugin's source is shaped
        without refilling)."""
        if not self.active:
            return draw(), {}
        n, batch = self.cfg.rollout.n, self.cfg.rollout.prompts_per_step
        rounds = self.dapo.max_sampling_rounds if self.dynamic and refill else 1
        parts: list[Experience] = []
        kept = 0
        while True:
            part = self._penalised(draw())
            parts.append(part)
            if not self.dynamic:
                break
            local = len(part.prompt_indices) - sum(flat_groups(part.rewards, n))
            kept += int(self._sum([float(local)])[0])
            if kept >= batch or len(parts) >= rounds:
                break
        metrics: dict[str, float] = {}
        if self.dynamic:
            experience, padding, metrics = self._select(parts, batch=batch)
        else:
            experience, padding = parts[0], [False] * len(parts[0].samples)
        metrics.update(self._overlong(experience))
        filtered = [self.overlong == "filter" and self._truncated(s) for s in experience.samples]
        samples = [masked(s) if pad or drop else s
                   for s, pad, drop in zip(experience.samples, padding, filtered, strict=True)]
        return dataclasses.replace(experience, samples=samples), metrics

    def _truncated(self, sample: RolloutSample) -> bool:
        return is_truncated(sample, max_new_tokens=self.cfg.rollout.max_new_tokens,
                            eos_token_id=self.eos_token_id)

    def _penalised(self, experience: Experience) -> Experience:
        """``experience`` with the overlong penalty added to its rewards (when selected)."""
        if self.overlong != "penalty":
            return experience
        lengths = [len(last_model_turn(s)) for s in experience.samples]
        penalty = overlong_penalty(lengths, max_new_tokens=self.cfg.rollout.max_new_tokens,
                                   buffer=self.buffer, penalty=self.dapo.overlong_penalty)
        return dataclasses.replace(experience, rewards=experience.rewards.double() + penalty)

    def _select(self, parts: list[Experience], *,
                batch: int) -> tuple[Experience, list[bool], dict[str, float]]:
        """Every rank's rounds gathered, the groups to train chosen in draw order
        (`plan_groups`), and this rank's share of them: (experience, per sample whether it is
        padding, metrics). Each round's prompts were dealt ``[dp_rank::dp_size]``."""
        n, dp = self.cfg.rollout.n, self.env.dp_size
        ranks = self._gather(parts)  # [rank][round] -> Experience
        order = []  # (rank, round, group) in draw order
        for r in range(len(parts)):
            counts = [len(ranks[k][r].prompt_indices) for k in range(dp)]
            order += [(k, r, i) for i in range(max(counts)) for k in range(dp) if i < counts[k]]
        flats = {(k, r): flat_groups(ranks[k][r].rewards, n)
                 for k in range(dp) for r in range(len(parts))}
        flat = [flats[k, r][i] for k, r, i in order]
        chosen, padding = plan_groups([not f for f in flat], batch=batch, multiple=dp)
        mine = (chosen + padding)[self.env.dp_rank::dp]
        groups = [take_groups(ranks[k][r], [i], n) for k, r, i in (order[j] for j in mine)]
        experience = dataclasses.replace(merge_experiences(groups),
                                         rollout_s=sum(p.rollout_s for p in parts),
                                         metrics=merge_experiences(parts).metrics)
        pads = set(padding)
        is_pad = [j in pads for j in mine for _ in range(n)]
        generated = sum(len(p.samples) for k in range(dp) for p in ranks[k])
        total = sum(float(p.rewards.sum()) for k in range(dp) for p in ranks[k])
        metrics = {f"{SAMPLING}rounds": float(len(parts)),
                   f"{SAMPLING}generated_groups": float(len(flat)),
                   f"{SAMPLING}kept_groups": float(len(flat) - sum(flat)),
                   f"{SAMPLING}dropped_groups": float(sum(flat)),
                   f"{SAMPLING}padded_groups": float(len(padding)),
                   f"{SAMPLING}reward_mean_generated": total / max(generated, 1)}
        return experience, is_pad, metrics

    def _overlong(self, experience: Experience) -> dict[str, float]:
        """Over the step's trained samples on every rank, read before any mask hides a
        truncation: ``response_truncated_fraction``, and ``overlong/filtered`` (truncated
        samples masked) or ``overlong/penalized`` (samples whose reward the penalty lowered)
        with ``overlong/penalty_mean``."""
        samples = experience.samples
        truncated = sum(self._truncated(s) for s in samples)
        penalty = overlong_penalty([len(last_model_turn(s)) for s in samples],
                                   max_new_tokens=self.cfg.rollout.max_new_tokens,
                                   buffer=self.buffer, penalty=self.dapo.overlong_penalty)
        totals = self._sum([float(len(samples)), float(truncated), float((penalty < 0).sum()),
                            float(penalty.sum())])
        count, truncated, penalized, penalty_sum = (float(v) for v in totals)
        metrics = {"response_truncated_fraction": truncated / max(count, 1.0)}
        if self.overlong == "filter":
            metrics[f"{OVERLONG}filtered"] = truncated
        elif self.overlong == "penalty":
            metrics[f"{OVERLONG}penalized"] = penalized
            metrics[f"{OVERLONG}penalty_mean"] = penalty_sum / max(count, 1.0)
        return metrics

    def _sum(self, values: list[float]) -> torch.Tensor:
        """``values`` summed over the data-parallel ranks (float64, on the CPU)."""
        import torch
        import torch.distributed as dist

        total = torch.tensor(values, dtype=torch.float64, device=self.env.device)
        group = self.env.dp_group
        if dist.is_initialized() and dist.get_world_size(group) > 1:
            dist.all_reduce(total, group=group)
        return total.cpu()

    def _gather(self, parts: list[Experience]) -> list[list[Experience]]:
        """Every data-parallel rank's rounds, by rank (pickled; each rank receives all the
        step's generated samples once)."""
        import torch.distributed as dist

        if not (dist.is_initialized() and dist.get_world_size(self.env.dp_group) > 1):
            return [parts]
        gathered: list[Any] = [None] * dist.get_world_size(self.env.dp_group)
        dist.all_gather_object(gathered, parts, group=self.env.dp_group)
        return gathered
