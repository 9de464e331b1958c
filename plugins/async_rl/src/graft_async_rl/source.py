"""The trainers' side: each step's experience from the rollout workers, the new weights to them.

Trainer rank 0 receives every worker's part of a step (in step order: a worker sends ahead
while the trainers update), puts the parts in the step's prompt order and shares the step with
the other trainers, each of which keeps its data-parallel share, exactly the samples it would
have generated itself in the colocated mode. After an update that a later step's samples need
(step t's weights generate step t + 1 + k), every trainer gathers the sharded weights tensor by
tensor (`graft_async_rl.wire.stream_weights`) and rank 0 broadcasts them to the workers in
buckets. A checkpoint keeps the steps the workers generated ahead
(rank 0 first waits for all of them), so a resumed run trains on the same samples.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from graft.engine import DistEnv, broadcast_object
from graft.errors import PluginError
from graft.export import default_bucket_bytes
from graft.rl import Experience
from graft_async_rl.experience_io import sample_from
from graft_async_rl.partial import tail_version
from graft_async_rl.roles import sync_ranks, transfer_device, version_for, worker_ranks
from graft_async_rl.wire import BroadcastSink, recv_object, stream_weights
from graft_async_rl.wire import broadcast_object as broadcast_to_workers

STALENESS_MEAN, STALENESS_MAX = "async_rl/staleness_mean", "async_rl/staleness_max"


class WorkerSource:
    """`graft.rl.ExperienceSource` of ``features.async_rl.workers`` rollout workers, on every
    training rank (``graft_experience_source``)."""

    def __init__(self, *, cfg: Any, job: Any, engine: Any, env: DistEnv) -> None:
        settings = cfg.features.async_rl
        self.k, self.timeout_s = settings.max_staleness, settings.worker_timeout_s
        self.partial = settings.partial_tokens > 0
        self.on_policy = self.k == 0
        self.job, self.env, self.n = job, env, cfg.rollout.n
        self.device = transfer_device(env.device)
        self.total_steps = cfg.trainer.total_steps
        world = dist.get_world_size()
        self.workers = worker_ranks(world, settings.workers)
        self.start_step = job.steps_done
        self.sampler_state = job.sampler.state_dict()  # at start_step (after a resume's load)
        self.buffer: dict[int, list[dict[str, Any]]] = {}  # rank 0: step -> the workers' parts
        self.sink = None
        if env.is_main:  # only the group's members create it
            group = dist.new_group(sync_ranks(world, settings.workers),
                                   use_local_synchronization=True)
            self.sink = BroadcastSink(group, self.device, self.timeout_s)
        self.model = engine.model
        self.bucket_bytes = default_bucket_bytes(cfg.export.bucket_mb, env.device)
        self._sent_frozen = False  # whether an export sent the parameters that do not train
        self.started = False
        self.last_step_end = time.perf_counter()

    def _start(self) -> None:
        """Tell the workers where the run starts and send them its weights (version =
        the steps done)."""
        if self.sink is not None:
            start = {"start_step": self.start_step, "sampler": self.sampler_state,
                     "next_step": self.start_step + 1 + len(self.buffer)}
            broadcast_to_workers(start, self.sink.group, self.device, self.timeout_s,
                                 "the rollout workers")
        self._export(self.start_step)
        self.started = True

    def experience(self, step: int, prompt_indices: list[int]) -> Experience:
        """This rank's share of step ``step``, from the workers' parts."""
        waited = 0.0
        if not self.started:
            self._start()
        full = None
        if self.env.is_main:
            started = time.perf_counter()
            self._receive_until(step)
            waited = time.perf_counter() - started
            full = self.buffer.pop(step)
        full = broadcast_object(full, group=self.env.group)
        experience = self._local_share(step, prompt_indices, full)
        wall = max(time.perf_counter() - self.last_step_end, 1e-9)
        experience.metrics["async_rl/trainer_idle_share"] = waited / wall
        return experience

    def _receive_until(self, step: int) -> None:
        """Rank 0: receive the workers' parts until step ``step``'s are all here."""
        while len(self.buffer.get(step, ())) < len(self.workers):
            for index, rank in enumerate(self.workers):
                part = recv_object(rank, self.device, self.timeout_s,
                                   f"rollout worker {index} (rank {rank})")
                self.buffer.setdefault(part["step"], []).append(part)

    def _local_share(self, step: int, prompt_indices: list[int],
                     parts: list[dict[str, Any]]) -> Experience:
        """The experience of this rank's data-parallel share of the step's prompts."""
        by_position = {}
        for part in parts:
            token_versions = part.get("token_versions")
            for offset, position in enumerate(part["positions"]):
                rows = slice(offset * self.n, (offset + 1) * self.n)
                runs = ([[(part["version"], len(s["response_ids"]))]
                         for s in part["samples"][rows]] if token_versions is None
                        else [[tuple(run) for run in r] for r in token_versions[rows]])
                by_position[position] = (part["samples"][rows], part["rewards"][rows], runs)
        positions = list(range(len(prompt_indices)))[self.env.dp_rank::self.env.dp_size]
        indices = [prompt_indices[p] for p in positions]
        samples = [sample_from(s) for p in positions for s in by_position[p][0]]
        rewards = torch.tensor([r for p in positions for r in by_position[p][1]],
                               dtype=torch.float64)
        runs = [r for p in positions for r in by_position[p][2]]
        versions = [sample_runs[0][0] for sample_runs in runs]  # each sample's first tokens'
        metrics = {**_mean_metrics(parts), **self._staleness(step, samples, runs),
                   "async_rl/rollout_idle_share": _idle_share(parts)}
        texts = [self.job.texts[i] for i in indices for _ in range(self.n)]
        return Experience(indices, texts, samples, rewards,
                          max(part["rollout_s"] for part in parts), metrics, versions)

    def _staleness(self, step: int, samples: list[Any],
                   runs: list[list[tuple[int, int]]]) -> dict[str, float]:
        """Each trained token's staleness (updates between the weights that generated it and
        this step's), checked against ``max_staleness`` and the versions the step may use
        (its own, and under partial rollouts the next step's after the switch); its token
        mean and max. ``runs``: per sample, ``[(version, token count), ...]``."""
        allowed = {version_for(step, self.k)}
        if self.partial:
            allowed.add(tail_version(step, self.k))
        total = tokens = worst = 0
        for sample, sample_runs in zip(samples, runs, strict=True):
            if sum(count for _, count in sample_runs) != len(sample.response_ids):
                raise PluginError(f"graft-async-rl: step {step} got a sample whose token "
                                  f"versions cover {sample_runs}, not its "
                                  f"{len(sample.response_ids)} tokens")
            for version, count in sample_runs:
                lag = step - 1 - version
                if lag > self.k or version not in allowed:
                    raise PluginError(f"graft-async-rl: step {step} got tokens of policy "
                                      f"version {version}, {lag} updates old (features."
                                      f"async_rl.max_staleness={self.k}); the workers and "
                                      f"trainers disagree")
                total, tokens = total + lag * count, tokens + count
                worst = max(worst, lag) if count else worst
        return {STALENESS_MEAN: total / max(tokens, 1), STALENESS_MAX: float(worst)}

    def publish(self, engine: Any, step: int) -> dict[str, float]:
        """After step ``step``'s update: the workers get these weights if a later step's
        samples are generated with them."""
        self.last_step_end = time.perf_counter()
        # the first step these weights generate: step + 1 + k (from its start), or under
        # partial rollouts step + k (after its switch)
        if step + self.k + (0 if self.partial else 1) > self.total_steps:
            return {"weight_sync_s": 0.0, "async_rl/weight_sync_gb": 0.0}
        return self._export(step)

    def _export(self, version: int) -> dict[str, float]:
        started = time.perf_counter()
        if self.sink is not None:
            self.sink.version = version
        # parameters that do not train never change: the first export of this process sends
        # them (the workers built them alike; a resumed run's workers get them again), later
        # ones only what trains and the buffers
        stream_weights(self.model, self.sink, bucket_bytes=self.bucket_bytes,
                       frozen=not self._sent_frozen)
        self._sent_frozen = True
        sent = self.sink.bytes if self.sink is not None else 0
        return {"weight_sync_s": time.perf_counter() - started,
                "async_rl/weight_sync_gb": sent / 1e9}

    def state_dict(self) -> dict[str, Any]:
        """The steps the workers generated ahead of the last update (rank 0 waits for them):
        after step s, those up to s + k."""
        if not self.env.is_main or not self.started:
            return {"buffer": {}}
        done = self.job.steps_done
        for step in range(done + 1, min(done + self.k, self.total_steps) + 1):
            self._receive_until(step)
        return {"buffer": {str(step): parts for step, parts in sorted(self.buffer.items())}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The steps a checkpoint kept (trained on before the workers' next)."""
        self.buffer = {int(step): parts for step, parts in state["buffer"].items()}

    def close(self) -> None:
        """Nothing to stop: each worker ends after the run's last step."""


def _mean_metrics(parts: list[dict[str, Any]]) -> dict[str, float]:
    names = {name for part in parts for name in part["metrics"]}
    return {name: sum(p["metrics"].get(name, 0.0) for p in parts) / len(parts) for name in names}


def _idle_share(parts: list[dict[str, Any]]) -> float:
    """The workers' mean share of time spent waiting for weights since their previous part."""
    shares = [p["idle_s"] / max(p["idle_s"] + p["rollout_s"], 1e-9) for p in parts]
    return sum(shares) / len(shares)
