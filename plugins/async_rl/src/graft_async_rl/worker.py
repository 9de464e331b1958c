"""A rollout worker: its own copy of the policy, generating each step's share of prompts with
the weights the staleness bound allows, ahead of the trainers.

The worker replays the run's prompt order (the sampler state the trainers started from), so it
knows every step's prompts without asking. Step t's samples are generated with the weights after
``max(0, t - 1 - k)`` updates: before generating a step the worker applies the versions it is
owed, in order; otherwise it generates on, sending each step's part to trainer rank 0 without
waiting for it to be taken.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from graft.engine import DistEnv
from graft.rl import RLJob
from graft_async_rl.experience_io import part_data
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
            start = broadcast_object(None, self.group, self.device, self.timeout_s,
                                     "the trainers' start (trainer rank 0)")
            job.sampler.load_state_dict(start["sampler"])
            self._update(job)  # the weights the run starts from
            per_step = self.cfg.rollout.prompts_per_step
            for _ in range(start["start_step"] + 1, start["next_step"]):  # kept by a checkpoint
                job.sampler.next_batch(per_step)
            for step in range(start["next_step"], self.cfg.trainer.total_steps + 1):
                indices = job.sampler.next_batch(per_step)
                while self.version < version_for(step, self.k):
                    self._update(job)
                positions = list(range(len(indices)))[self.index::self.workers]
                experience = job.collect([indices[p] for p in positions], step=step)
                part = part_data(step=step, worker=self.index, version=self.version,
                                 positions=positions, samples=experience.samples,
                                 rewards=experience.rewards, rollout_s=experience.rollout_s,
                                 metrics=experience.metrics, idle_s=self.idle_s)
                self.idle_s = 0.0
                send_object(part, 0, self.device, pending)
            pending.wait_all(self.timeout_s, "trainer rank 0 to take the last samples")
        finally:
            job.close()

    def _update(self, job: RLJob) -> None:
        """Apply the next version of the weights (counting the wait as idle time)."""
        started = time.perf_counter()
        self.version = receive_weights(job.engine.model, self.group, self.device,
                                       self.timeout_s)
        job.rollout.sync_weights()
        self.idle_s += time.perf_counter() - started
