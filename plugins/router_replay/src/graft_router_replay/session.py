"""Routing replay for one trained model: which pass records, which replays, and the rollout.

| phase            | R2                                           | R3                      |
|------------------|----------------------------------------------|-------------------------|
| rollout          | -                                            | record (engine)         |
| rollout_logprobs | native                                       | replay                  |
| old_logprobs     | record                                       | replay                  |
| ref_logprobs     | native (the reference keeps its own routing) | native                  |
| update           | replay; native when the step is on-policy    | replay                  |

An on-policy step (one update per rollout) has no old-log-prob pass: under R2 the update is
itself the first forward of the current weights, so it routes natively and records nothing.
Micro-batches with no sample (rank balancing) always route natively.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from graft.engine import OLD_LOGPROBS, ROLLOUT_LOGPROBS, UPDATE
from graft.errors import ConfigError, PluginError
from graft.models import family_for
from graft_router_replay.config import R2, R3
from graft_router_replay.controller import ReplayController, State
from graft_router_replay.ingest import ENGINE_OUTPUT, ingest_routes
from graft_router_replay.layers import router_map
from graft_router_replay.metrics import ReplayCounters
from graft_router_replay.recorder import GenerationRecorder
from graft_router_replay.routes import ROUTES, VALID, RouteError, bytes_per_token, native_rows, real_tokens

REPLAYED_PHASES = {R2: (UPDATE,), R3: (ROLLOUT_LOGPROBS, OLD_LOGPROBS, UPDATE)}


class ReplaySession:
    """The policy model's routers, their controller and the step's counters, for one run.

    Built before the model is sharded, from its modules and config only: a model built from
    ``model.path`` has meta parameters then. ``mesh``: the data-parallel mesh the step's
    counts are summed over (None: no process group of the model's).
    """

    def __init__(self, model: torch.nn.Module, mode: str, mesh: Any = None) -> None:
        self.mode = mode
        self.model = model
        self.routers = router_map(model, family_for(model.config.model_type))
        self.counters = ReplayCounters(None if mesh is None else mesh_device(mesh))
        self.controller = ReplayController(self.routers, self.counters)
        self.recorded_this_step = False
        self.recorder: GenerationRecorder | None = None

    def begin_step(self) -> None:
        """A new step: no routes recorded yet, counters at zero."""
        self.counters.reset()
        self.recorded_this_step = False
        self.controller.disable()

    def prepare(self, batch: dict[str, Any], layout: Any, phase: str, shard: Any = None) -> None:
        """Arm the controller for the forward of ``batch`` in ``phase``; ``shard`` (a
        `graft.engine.SequenceShard`, None: whole rows) is the part of every row it computes."""
        if layout.num_samples == 0:
            self.controller.disable()
        elif self.mode == R2 and phase == OLD_LOGPROBS:
            self.controller.record()
        elif phase in REPLAYED_PHASES[self.mode] and (self.mode == R3 or self.recorded_this_step):
            self._arm_replay(batch, layout, phase, shard)
        else:
            self.controller.disable()

    def finish(self, layout: Any, shard: Any = None) -> dict[str, torch.Tensor] | None:
        """After a forward: the routes it recorded on ``shard``'s part of every row (kept for
        the later passes; the core gathers the parts), or the check that a replayed forward
        reached every recorded layer."""
        if self.controller.state is not State.RECORD:
            self.controller.check_replayed()
            return None
        ids = self.controller.take_recorded()  # the model's own choices: in range by construction
        self.recorded_this_step = True
        self.controller.disable()
        local = _local(shard)
        grid = (layout.num_rows, layout.row_length if shard is None else shard.length)
        return {ROUTES: ids.to(torch.int16).reshape(*grid, *ids.shape[1:]),
                VALID: local(real_tokens(layout)).to(ids.device)}

    def begin_rollout(self, rollout: Any) -> None:
        """R3: record the rollout's routing (hooks on a torch model, or the engine's output)."""
        self.controller.disable()
        self._close_recorder()
        if self.mode != R3:
            return
        model = rollout.model
        if model is not None:
            routers = (self.routers if model is self.model
                       else router_map(model, family_for(model.config.model_type)))
            self.recorder = GenerationRecorder(model, routers)
            return
        try:
            rollout.request_extras(ENGINE_OUTPUT)
        except PluginError as exc:
            raise ConfigError(f"features.router_replay.mode=R3 records routing at rollout, and "
                              f"the {rollout.kind} engine cannot provide it: {exc} Use "
                              f"rollout.engine=embedded (routes recorded with router hooks) or "
                              f"features.router_replay.mode=R2 (recorded by the trainer)") from exc

    def end_rollout(self, samples: Sequence[Any]) -> None:
        """R3: attach each sample's routes and valid flag as per-token extras."""
        if self.mode != R3:
            return
        if self.recorder is not None:
            per_sample = self.recorder.routes_for(samples)
            self._close_recorder()
        else:
            per_sample = [ingest_routes(s.engine_extras.get(ENGINE_OUTPUT),
                                        prompt_length=len(s.prompt_ids),
                                        response_length=len(s.response_ids),
                                        routers=self.routers) for s in samples]
        for sample, (routes, valid) in zip(samples, per_sample, strict=True):
            sample.extras[ROUTES] = routes
            sample.extras[VALID] = valid

    def step_metrics(self) -> dict[str, float]:
        """The step's ``router_replay/*`` metrics (every rank, summed over ranks)."""
        return self.counters.metrics()

    def close(self) -> None:
        """Take every hook off the model."""
        self.controller.remove()
        self._close_recorder()

    def _arm_replay(self, batch: dict[str, Any], layout: Any, phase: str, shard: Any) -> None:
        routes, valid = batch.get(ROUTES), batch.get(VALID)
        if routes is None or valid is None:
            raise RouteError(f"features.router_replay.mode={self.mode} replays routes in the "
                             f"{phase} pass, but this micro-batch carries none "
                             f"({ROUTES!r}, {VALID!r})")
        grid = (layout.num_rows, layout.row_length)
        if tuple(routes.shape[:2]) != grid or tuple(valid.shape) != grid:
            raise RouteError(f"routes {tuple(routes.shape)} and flags {tuple(valid.shape)} do not "
                             f"cover the micro-batch's {grid} token grid")
        local = _local(shard)
        routes, valid = local(routes), local(valid)
        flat = routes.reshape(-1, *routes.shape[2:])
        flags = valid.reshape(-1)
        real = local(real_tokens(layout).to(routes.device)).reshape(-1)
        count = phase == UPDATE
        self.controller.replay(flat, native_rows(flat, flags), real, count=count)
        if count:
            self.counters.add_storage(bytes_per_token(routes, valid), real.sum())

    def _close_recorder(self) -> None:
        if self.recorder is not None:
            self.recorder.close()
            self.recorder = None


def _local(shard: Any) -> Any:
    """``shard.local`` (this rank's part of every row), or the identity without a shard."""
    return shard.local if shard is not None else (lambda tensor: tensor)


_active: ReplaySession | None = None


def start_session(model: torch.nn.Module, mode: str, mesh: Any = None) -> ReplaySession:
    """Replace the process's session (hooks of an earlier model come off) with one on ``model``
    (``mesh``: the data-parallel mesh it will be sharded over)."""
    global _active
    stop_session()
    _active = ReplaySession(model, mode, mesh)
    return _active


def mesh_device(mesh: Any) -> torch.device:
    """The device a mesh's collectives run on: CPU for gloo, this rank's GPU for NCCL."""
    if mesh.device_type == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(mesh.device_type)


def stop_session() -> None:
    """Take the current session's hooks off (if any); replay is off until the next start."""
    global _active
    if _active is not None:
        _active.close()
    _active = None


def active_session() -> ReplaySession | None:
    """The session of the model being trained in this process, or None (replay disabled)."""
    return _active
