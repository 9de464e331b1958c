"""What an RL update trains on (`Experience`), where it comes from (`ExperienceSource`), how a
plugin shapes it before the update (`BatchShaper`), and the seed each sample is drawn with
(`sample_seed`).

In the colocated mode the job collects each step's experience itself
(`graft.rl.job.RLJob.collect`). A plugin may instead supply a step's experience from elsewhere
through ``graft_experience_source`` (graft-async-rl: rollout workers on other ranks, generating
ahead with an older policy) and receive the new weights after every update. A plugin may also
shape what a step trains on through ``graft_batch_shaper`` (graft-dapo: groups of equal rewards
dropped and the step refilled, truncated responses masked or penalised); without one, a step
trains on one draw as it is. `merge_experiences`, `last_model_turn` and `is_truncated` are the
helpers such plugins and the step's metrics share.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from graft.engine.train_engine import TrainEngine
    from graft.rollout.types import RolloutSample


@dataclass
class Experience:
    """Scored rollouts: ``rollout.n`` consecutive samples for each prompt, prompts in the order
    of ``prompt_indices`` (their positions in the dataset).

    ``texts[i]``, ``samples[i]`` and ``rewards[i]`` (float64) belong to the i-th sample;
    ``rollout_s``: seconds the generation took; ``metrics``: what the rollout reports besides
    (the rewards' counts, a plugin's episodes); ``policy_versions``: per sample, the number of
    updates the weights that generated it had seen (None: this step's own weights).
    """

    prompt_indices: list[int]
    texts: list[Any]
    samples: list[RolloutSample]
    rewards: torch.Tensor
    rollout_s: float
    metrics: dict[str, float] = field(default_factory=dict)
    policy_versions: list[int] | None = None


@runtime_checkable
class ExperienceSource(Protocol):
    """Supplies each RL step's experience in place of the job's own rollouts
    (``graft_experience_source``), on every training rank.

    ``on_policy``: whether every sample comes from the weights of the step that trains on it
    (then the old log-probs need not be recomputed for a single update).
    """

    on_policy: bool

    def experience(self, step: int, prompt_indices: list[int]) -> Experience:
        """This rank's share of step ``step``'s experience (1-based), for the step's prompts
        ``prompt_indices`` (all of them, in the order the sampler drew them; this rank trains
        on ``prompt_indices[dp_rank::dp_size]``)."""

    def publish(self, engine: TrainEngine, step: int) -> dict[str, float]:
        """After step ``step``'s update (every training rank): hand the new weights to
        whatever generates; return metrics (the sync's seconds and bytes)."""

    def state_dict(self) -> dict[str, Any]:
        """JSON-ready state for the checkpoint (samples generated ahead, versions)."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a checkpointed `state_dict` (called before the first `experience`)."""

    def close(self) -> None:
        """Stop what the source started; idempotent."""


@runtime_checkable
class BatchShaper(Protocol):
    """Shapes each RL step's experience before the update (``graft_batch_shaper``), on every
    training rank (the ranks run the same collectives)."""

    def shape(self, draw: Callable[[], Experience], *,
              refill: bool) -> tuple[Experience, dict[str, float]]:
        """This rank's share of the step's experience to train on, and the shaping's metrics
        (they join the step's after the update's, replacing any of the same name).

        ``draw()``: this rank's share of one more round (a fresh draw of
        ``rollout.prompts_per_step`` prompts, ``rollout.n`` samples each); call it at least
        once, and the same number of times on every rank. ``refill``: whether drawing again
        is allowed (the colocated mode); False when a plugin's `ExperienceSource` supplies the
        step: draw exactly once."""


def merge_experiences(parts: Sequence[Experience]) -> Experience:
    """One `Experience` of ``parts`` (non-empty), in order: their prompts, samples and rewards
    concatenated, their generation seconds summed, each metric the mean of the parts that
    report it, ``policy_versions`` concatenated (None when a part has none)."""
    import torch

    keys = dict.fromkeys(k for p in parts for k in p.metrics)
    metrics = {k: sum(p.metrics[k] for p in parts if k in p.metrics)
               / sum(k in p.metrics for p in parts) for k in keys}
    versions = None if any(p.policy_versions is None for p in parts) else [
        v for p in parts for v in p.policy_versions or ()]
    return Experience([i for p in parts for i in p.prompt_indices],
                      [t for p in parts for t in p.texts], [s for p in parts for s in p.samples],
                      torch.cat([p.rewards.double() for p in parts]),
                      sum(p.rollout_s for p in parts), metrics, versions)


def last_model_turn(sample: RolloutSample) -> list[int]:
    """The response tokens ``rollout.max_new_tokens`` caps: all of a single-turn response, an
    episode's last run of model tokens (``loss_mask`` 1) otherwise."""
    if sample.loss_mask is None:
        return list(sample.response_ids)
    model = sample.loss_mask.tolist()
    end = max((i + 1 for i, m in enumerate(model) if m), default=0)
    start = end
    while start > 0 and model[start - 1]:
        start -= 1
    return list(sample.response_ids[start:end])


def is_truncated(sample: RolloutSample, *, max_new_tokens: int, eos_token_id: int | None) -> bool:
    """Whether the sample's `last_model_turn` ran to ``max_new_tokens`` tokens without ``eos``
    (read before any loss mask is zeroed: a zeroed mask hides the turn)."""
    turn = last_model_turn(sample)
    return len(turn) >= max_new_tokens and turn[-1] != eos_token_id


def sample_seed(seed: int, step: int, prompt_index: int, sample_number: int) -> int:
    """The 63-bit seed of one sample: a hash of the run's ``trainer.seed``, the RL ``step``
    (1-based), the prompt's index in the dataset and the sample's number among the prompt's
    ``rollout.n``. Never of the rank, the worker or the batch that draws it, so the same
    sample gets the same tokens colocated, on a rollout worker, and after a resume."""
    key = f"{seed}:{step}:{prompt_index}:{sample_number}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1
