"""What an RL update trains on (`Experience`), where it comes from (`ExperienceSource`), and the
seed each sample is drawn with (`sample_seed`).

In the colocated mode the job collects each step's experience itself
(`graft.rl.job.RLJob.collect`). A plugin may instead supply a step's experience from elsewhere
through ``graft_experience_source`` (graft-async-rl: rollout workers on other ranks, generating
ahead with an older policy) and receive the new weights after every update.
"""

from __future__ import annotations

import hashlib
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


def sample_seed(seed: int, step: int, prompt_index: int, sample_number: int) -> int:
    """The 63-bit seed of one sample: a hash of the run's ``trainer.seed``, the RL ``step``
    (1-based), the prompt's index in the dataset and the sample's number among the prompt's
    ``rollout.n``. Never of the rank, the worker or the batch that draws it, so the same
    sample gets the same tokens colocated, on a rollout worker, and after a resume."""
    key = f"{seed}:{step}:{prompt_index}:{sample_number}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1
