"""Validation: the policy generates on the held-out set, scored with the run's reward.

With ``data.val_path`` and ``trainer.val_every_steps`` > 0 the RL job validates before the first
step (step 0), every ``val_every_steps`` steps and after the last: ``val.n`` responses per
held-out prompt (greedy at ``val.temperature=0``, the default), up to ``val.max_new_tokens``
(default ``rollout.max_new_tokens``) tokens, scored by the rewards training uses. Metrics, over
every rank: ``val/reward_mean``, ``val/pass@k`` (k = ``val.n``: the unbiased estimator of the
chance that one of k responses is right, a response being right at reward >= 1) and
``val/response_length`` (tokens).

The prompts are split over the data-parallel ranks (a rank without one generates a stand-in
prompt whose result is dropped: its generation's collectives pair with the other ranks'). The
generation runs under a forked RNG seeded from ``trainer.seed`` and the step, so sampling at
``val.temperature`` > 0 is reproducible and training draws the same random numbers as a run
without validation. Validation's generation calls no rollout hooks (``graft_rollout_begin`` /
``graft_rollout_end`` see training's rollouts only).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from graft.data.dataset import Prompts
from graft.data.tasks import TextSample
from graft.engine.distributed.env import DistEnv, all_reduce
from graft.rollout.types import EpisodeRunner, RolloutEngine, RolloutSample, SamplingSpec

if TYPE_CHECKING:
    from graft.config.schema import RolloutConfig, TrainerConfig, ValConfig

PREFIX = "val/"
RIGHT = 1.0  # a response is right (for pass@k) at this reward or more
SEED_OFFSET = 7_919  # validation's RNG seeds stay away from training's trainer.seed


def pass_at_k(n: int, correct: int, k: int) -> float:
    """The unbiased estimate of pass@k from ``n`` samples of which ``correct`` are right:
    ``1 - C(n - c, k) / C(n, k)`` (Chen et al., 2021)."""
    if not 0 < k <= n:
        raise ValueError(f"pass@k needs 0 < k <= n, got k={k}, n={n}")
    if n - correct < k:
        return 1.0
    return 1.0 - math.comb(n - correct, k) / math.comb(n, k)


@dataclass(frozen=True)
class ValidationResult:
    """One validation: the metrics (over every rank) and this rank's samples, responses and
    rewards (``val.n`` consecutive per prompt), with its prompts' ids (as the data loader
    encoded them) and what the engine or the episodes generated (``generated``, one per
    response: the prompt the model saw, an environment's ``reset`` included)."""

    metrics: dict[str, float]
    samples: list[TextSample]
    prompt_ids: list[list[int]]
    responses: list[str]
    rewards: list[float]
    generated: list[RolloutSample] = field(default_factory=list)


class Validator:
    """Generates on this rank's share of the held-out prompts and scores them.

    ``val`` says how (its ``max_new_tokens`` null: ``rollout.max_new_tokens``); the RNG is
    seeded from ``trainer.seed``.
    """

    def __init__(self, prompts: Prompts, env: DistEnv, *, val: ValConfig, trainer: TrainerConfig,
                 rollout: RolloutConfig) -> None:
        limit = val.max_prompts or len(prompts.ids)
        self.samples, self.ids = prompts.samples[:limit], prompts.ids[:limit]
        self.env = env
        self.n = val.n
        self.seed = trainer.seed
        self.spec = SamplingSpec(val.temperature, val.top_p,
                                 val.max_new_tokens or rollout.max_new_tokens)

    def run(self, rollout: RolloutEngine, *, score: Callable[[list[str], list[TextSample]],
                                                              list[float]],
            decode: Callable[[RolloutSample], str], step: int,
            episodes: EpisodeRunner | None = None) -> ValidationResult:
        """Generate ``val.n`` responses per prompt of this rank (with ``episodes``, a plugin's
        `graft.rollout.EpisodeRunner`: ``val.n`` of its samples, graft-multiturn's episodes),
        score them with ``score`` (responses, samples) and reduce the metrics over the ranks
        (every rank calls it)."""
        local = list(range(len(self.ids)))[self.env.dp_rank::self.env.dp_size]
        prompts = [self.ids[i] for i in local for _ in range(self.n)]
        samples = [self.samples[i] for i in local for _ in range(self.n)]
        devices = [self.env.device] if self.env.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(self.seed + SEED_OFFSET + step)
            if episodes is not None:  # every rank runs the busiest rank's turns
                batch = episodes.run(rollout, samples, prompts, self.spec)
                generated = batch.samples
            else:
                # A rank without prompts still generates (one stand-in, dropped): every rank's
                # engine takes part in the same collectives.
                generated = rollout.generate(prompts or self.ids[:1], self.spec)
        generated = generated[:len(prompts)]
        responses = [decode(s) for s in generated]
        if episodes is not None:
            rewards = batch.total_rewards(score, responses, samples)
        else:
            rewards = [float(r) for r in score(responses, samples)] if samples else []
        lengths = [len(s.response_ids) for s in generated]
        metrics = self._reduce(rewards, lengths)
        return ValidationResult(metrics, samples, [self.ids[i] for i in local], responses,
                                rewards, list(generated))

    def _reduce(self, rewards: Sequence[float], lengths: Sequence[int]) -> dict[str, float]:
        groups = [rewards[i:i + self.n] for i in range(0, len(rewards), self.n)]
        passed = sum(pass_at_k(self.n, sum(r >= RIGHT for r in group), self.n)
                     for group in groups)
        totals = all_reduce(torch.tensor(
            [sum(rewards), float(len(rewards)), float(sum(lengths)), passed, float(len(groups))],
            dtype=torch.float64, device=self.env.device), group=self.env.dp_group)
        reward_sum, count, length_sum, pass_sum, prompts = (float(v) for v in totals)
        return {f"{PREFIX}reward_mean": reward_sum / max(count, 1.0),
                f"{PREFIX}pass@{self.n}": pass_sum / max(prompts, 1.0),
                f"{PREFIX}response_length": length_sum / max(count, 1.0)}
