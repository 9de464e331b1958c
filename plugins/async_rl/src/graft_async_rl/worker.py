"""A rollout worker: its own copy of the policy, generating each step's share of prompts with
the weights the staleness bound allows, ahead of the trainers.

The worker replays the run's prompt order (the sampler state the trainers started from), so it
knows every step's prompts without asking. Step t's samples are generated with the weights after
``max(0, t - 1 - k)`` updates: before generating a step the worker applies the versions it is
owed, in order; otherwise it generates on, sending each step's part to trainer rank 0 without
waiting for it to be taken. With partial rollouts (``partial_tokens``) it also takes the next
version part-way through each step (`graft_async_rl.partial`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from graft.engine import DistEnv
from graft.errors import ConfigError
from graft.rl import RLJob
from graft_async_rl.experience_io import part_data
from graft_async_rl.partial import PartialRollout, tail_version
from graft_async_rl.roles import WORKER_PREFIX, sync_ranks, transfer_device, version_for
from graft_async_rl.wire import PendingSends, broadcast_object, receive_weights, send_object


class RolloutWorker:
    """The runner of role ``rollout.<index>`` (``graft_role_runner``)."""

    def __init__(self, *, role: str, cfg: Any, env: DistEnv, run_dir: Path) -> None:
        import torch.distributed as dist

        settings = cfg.features.async_rl
        self.index = int(role.removeprefix(WORKER_PREFIX))
        self.workers, self.k = settings.workers, settings.max_staleness
        self.timeout_s = settings.worker_timeout_s
        self.partial_tokens = settings.partial_tokens
        self.cfg, self.env, self.run_dir = cfg, env, run_dir
        self.device = transfer_device(env.device)
        self.group = dist.new_group(sync_ranks(dist.get_world_size(), self.workers),
                                    use_local_synchronization=True)
        self.version = -1
        self.idle_s = 0.0

    def run(self) -> None:
        """Generate every step the trainers will train on, then stop."""
        job = RLJob.for_rollouts(self.cfg, env=self.env, run_dir=self.run_dir)
        pending = PendingSends()
        try:
            partial = self._partial(job) if self.partial_tokens else None
            start = broadcast_object(None, self.group, self.device, self.timeout_s,
                                     "the trainers' start (trainer rank 0)")
            job.sampler.load_state_dict(start["sampler"])
            self._update(job)  # the weights the run starts from
            per_step = self.cfg.rollout.prompts_per_step
            for _ in range(start["start_step"] + 1, start["next_step"]):  # kept by a checkpoint
                job.sampler.next_batch(per_step)
            for step in range(start["next_step"], self.cfg.trainer.total_steps + 1):
                indices = job.sampler.next_batch(per_step)
                version = self._take(job, version_for(step, self.k))
                positions = list(range(len(indices)))[self.index::self.workers]
                if partial is not None:
                    partial.step, partial.versions = step, []
                idle_before = self.idle_s
                experience = job.collect([indices[p] for p in positions], step=step)
                if partial is not None:  # the next step's version, also when nothing went on
                    self._take(job, tail_version(step, self.k))
                # a partial rollout's wait for the next version is idle time, not generation
                rollout_s = experience.rollout_s - (self.idle_s - idle_before)
                part = part_data(step=step, worker=self.index, version=version,
                                 positions=positions, samples=experience.samples,
                                 rewards=experience.rewards, rollout_s=max(rollout_s, 0.0),
                                 metrics=experience.metrics, idle_s=self.idle_s,
                                 token_versions=None if partial is None else partial.versions)
                self.idle_s = 0.0
                send_object(part, 0, self.device, pending)
            pending.wait_all(self.timeout_s, "trainer rank 0 to take the last samples")
        finally:
            job.close()

    def _partial(self, job: RLJob) -> PartialRollout:
        """The job's engine, switching weights part-way through each step (``partial_tokens``)."""
        if job.episodes is not None:
            raise ConfigError("features.async_rl.partial_tokens: a plugin's episodes (an "
                              "environment's turns) generate in calls of their own, which a "
                              "partial rollout cannot split; set features.async_rl."
                              "partial_tokens=0 or run without the environment")
        job.rollout = PartialRollout(job.rollout, partial_tokens=self.partial_tokens,
                                     max_staleness=self.k,
                                     eos_token_id=job.tokenizer.eos_token_id,
                                     take_version=lambda version: self._take(job, version))
        return job.rollout

    def _take(self, job: RLJob, version: int) -> int:
        """Apply the versions owed up to ``version``, in order; the version now applied."""
        while self.version < version:
            self._update(job)
        return self.version

    def _update(self, job: RLJob) -> None:
        """Apply the next version of the weights (counting the wait as idle time)."""
        started = time.perf_counter()
        self.version = receive_weights(job.engine.model, self.group, self.device,
                                       self.timeout_s)
        job.rollout.sync_weights()
        self.idle_s += time.perf_counter() - started
