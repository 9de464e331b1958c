"""Which ranks train and which generate, and the group the weights travel in."""

from __future__ import annotations

from typing import Any

from graft.errors import ConfigError

TRAINER = "trainer"
WORKER_PREFIX = "rollout."


def split_ranks(world_size: int, workers: int) -> dict[str, list[int]]:
    """The trainers (the first ``world_size - workers`` ranks) and one role per rollout worker
    (``rollout.0``, ``rollout.1``...: the last ranks, each on a one-rank mesh of its own)."""
    if workers >= world_size:
        raise ConfigError(f"features.async_rl.workers={workers} leaves no rank to train among "
                          f"the {world_size} this run has; start more (graft train --nproc "
                          f"{workers + 1} or more) or use fewer workers")
    trainers = world_size - workers
    return {TRAINER: list(range(trainers)),
            **{f"{WORKER_PREFIX}{i}": [trainers + i] for i in range(workers)}}


def worker_ranks(world_size: int, workers: int) -> list[int]:
    """The global ranks of the rollout workers, in worker order."""
    return list(range(world_size - workers, world_size))


def sync_ranks(world_size: int, workers: int) -> list[int]:
    """The ranks the weights travel among: trainer rank 0 and the workers."""
    return [0, *worker_ranks(world_size, workers)]


def transfer_device(device: Any) -> Any:
    """Where the tensors that cross between trainers and workers live: the ranks' device, or
    host memory when ranks share a GPU (`graft.engine.ranks_share_gpus`)."""
    import torch

    from graft.engine import ranks_share_gpus

    return torch.device("cpu") if device.type == "cuda" and ranks_share_gpus() else device


def version_for(step: int, max_staleness: int) -> int:
    """The policy version (updates done) that generates step ``step``'s samples (1-based):
    ``max(0, step - 1 - max_staleness)``."""
    return max(0, step - 1 - max_staleness)
