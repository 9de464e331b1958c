"""The ``features.async_rl`` config section (no torch: imported by every command)."""

from __future__ import annotations

from dataclasses import dataclass

from graft.config import bounded


@dataclass
class AsyncRLConfig:
    """``features.async_rl``: rollout workers on ranks of their own, generating ahead of the
    trainers with weights at most ``max_staleness`` updates old."""

    # Ranks that generate (the last ones of `graft train --nproc N`); the other N - workers
    # train. 0: off (every rank generates, then trains: the colocated mode).
    workers: int = bounded(0, ge=0)
    # The policy lag k in updates: step t trains on samples generated with the weights after
    # max(0, t - 1 - k) updates, so the workers generate up to k steps ahead. 0: on-policy
    # (the workers wait for each update); 1: one-step-off.
    max_staleness: int = bounded(1, ge=0)
    # Seconds a trainer waits for a worker's samples (or a worker for the trainers' weights)
    # before the run stops with an error naming the worker.
    worker_timeout_s: float = bounded(600.0, gt=0.0)
    # Partial rollouts: after this many tokens of a step's sequences, the worker takes the
    # next policy version (the one the next step starts with) and the unfinished sequences go
    # on with it, each token keeping the version and log-prob it was sampled with (the first
    # tokens max_staleness updates old, the rest one fewer). 0: off. Needs max_staleness >= 1.
    partial_tokens: int = bounded(0, ge=0)
