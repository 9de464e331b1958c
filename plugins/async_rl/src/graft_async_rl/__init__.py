"""graft-async-rl: RL with rollout workers on ranks of their own, generating ahead of the
trainers with weights at most ``max_staleness`` updates old (entry point ``async_rl``, section
``features.async_rl``, `AsyncRLConfig`).

Public: `AsyncRLConfig`; `split_ranks` and `version_for` (which ranks generate, and which
policy version generates a step: `graft_async_rl.roles`, no torch); `WorkerSource` (the
trainers' `graft.rl.ExperienceSource`) and `RolloutWorker` (a worker's loop), loaded on first
use: they import torch.
"""

from graft import lazy_attributes
from graft_async_rl.config import AsyncRLConfig
from graft_async_rl.roles import split_ranks, version_for

__version__ = "0.1.0"

__all__ = ["AsyncRLConfig", "RolloutWorker", "WorkerSource", "__version__", "split_ranks",
           "version_for"]

__getattr__ = lazy_attributes(__name__, {"RolloutWorker": "graft_async_rl.worker",
                                         "WorkerSource": "graft_async_rl.source"})
