"""What every rollout engine takes and returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch


@dataclass(frozen=True)
class SamplingSpec:
    """How to sample: from ``rollout.*``."""

    temperature: float
    top_p: float
    max_new_tokens: int


@dataclass
class RolloutSample:
    """One generated response.

    Attributes:
        prompt_ids / response_ids: token ids (the response ends with ``eos`` unless it was cut
            at ``max_new_tokens``).
        logprobs: the generator's log-probability of each response token under
            ``logits / temperature`` (fp32, ``len(response_ids)``).
        extras: per-token tensors plugins recorded (``graft_rollout_end``), one row per token of
            prompt + response.
    """

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: torch.Tensor
    extras: dict[str, torch.Tensor] = field(default_factory=dict)


class RolloutEngine(Protocol):
    """Generates responses and takes new weights after every update."""

    name: str

    def generate(self, prompts: list[list[int]], spec: SamplingSpec) -> list[RolloutSample]:
        """One response per prompt (repeat a prompt for several samples); every rank calls it."""

    def sync_weights(self) -> dict[str, float]:
        """Make the engine use the trainer's current weights; returns metrics (seconds, bytes)."""

    def close(self) -> None:
        """Release the engine."""


def cut_at_eos(tokens: list[int], eos_id: int | None) -> list[int]:
    """A generated row up to and including the first ``eos`` (the padding after it dropped)."""
    if eos_id is not None and eos_id in tokens:
        return tokens[:tokens.index(eos_id) + 1]
    return list(tokens)
