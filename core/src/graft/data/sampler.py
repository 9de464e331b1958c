"""Which samples each step uses: a seeded permutation per epoch, resumable from its position,
split over the data-parallel ranks (each takes every ``dp_size``-th index of a global batch)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from graft.errors import ConfigError


def check_every_rank_gets_samples(size: int, dp_size: int, *, key: str, what: str) -> None:
    """`ConfigError` unless a global batch of ``size`` (the config key ``key``, counting
    ``what``) gives each of ``dp_size`` data-parallel ranks at least one.

    Called at run start: a rank without samples skips work whose collectives the other ranks
    wait in (RL on 2 ranks with one prompt per step hung in generation; SFT failed on an empty
    batch).
    """
    if size < dp_size:
        raise ConfigError(
            f"{key}={size} is less than the number of data-parallel ranks ({dp_size}): each "
            f"step's {what} are split over the ranks, and a rank with none cannot take part in "
            f"the others' collectives. Set {key} to at least {dp_size} (a multiple of {dp_size} "
            f"splits evenly), or run on at most {size} rank{'s' if size > 1 else ''} (--nproc).")


def batch_checked_job(job_class: Callable[[], type], *, batch_key: str,
                      what: str) -> Callable[..., Any]:
    """A ``graft_trainer_modes`` factory: at run start it checks that every data-parallel rank
    gets part of the global batch the config key ``batch_key`` sizes (``what`` it counts;
    `check_every_rank_gets_samples`), then builds ``job_class()(cfg, tokenizer, env)``.
    ``job_class`` returns the class when called, so its torch imports wait for a run."""

    def build(*, cfg: Any, tokenizer: Any, env: Any) -> Any:
        section, key = batch_key.split(".")
        check_every_rank_gets_samples(getattr(getattr(cfg, section), key), env.dp_size,
                                      key=batch_key, what=what)
        return job_class()(cfg, tokenizer, env)

    return build


@dataclass
class EpochSampler:
    """Yields global batches of sample indices; ``state_dict`` / ``load_state_dict`` resume it."""

    num_samples: int
    seed: int
    shuffle: bool = True
    epoch: int = 0
    offset: int = 0
    # (epoch, its permutation): one shuffle per epoch, not one per batch.
    _cached: tuple[int, list[int]] | None = field(default=None, init=False, repr=False,
                                                 compare=False)

    def _order(self, epoch: int) -> list[int]:
        if self._cached is None or self._cached[0] != epoch:
            order = list(range(self.num_samples))
            if self.shuffle:
                random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
            self._cached = (epoch, order)
        return self._cached[1]

    def next_batch(self, size: int) -> list[int]:
        """The next ``size`` indices, continuing into the next epoch when this one runs out."""
        if self.num_samples <= 0:
            raise ValueError("cannot sample batches from an empty dataset")
        batch: list[int] = []
        while len(batch) < size:
            order = self._order(self.epoch)
            take = order[self.offset:self.offset + size - len(batch)]
            batch.extend(take)
            self.offset += len(take)
            if self.offset >= self.num_samples:
                self.epoch, self.offset = self.epoch + 1, 0
        return batch

    def epochs_done(self) -> float:
        """How many passes over the dataset the batches so far made: samples drawn over the
        dataset's size (2.5 after two and a half epochs)."""
        return self.epoch + self.offset / max(self.num_samples, 1)

    def state_dict(self) -> dict[str, int]:
        """The position: epoch and offset within it."""
        return {"epoch": self.epoch, "offset": self.offset}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from a saved position."""
        self.epoch, self.offset = int(state["epoch"]), int(state["offset"])
        self._cached = None
