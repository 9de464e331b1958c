"""The plugin's table of contents: every point where graft-router-replay touches Graft's core,
in the order of a run. Every hook is a no-op while ``features.router_replay.mode=disabled``.
"""

from __future__ import annotations

from typing import Any

from graft import hookimpl
from graft_router_replay.config import (
    DISABLED,
    R3,
    RouterReplayConfig,
    replay_mode,
    run_conflict,
)


@hookimpl
def graft_config_sections() -> list[tuple[str, type]]:
    """``features.router_replay`` (``mode``: disabled, R2, R3)."""
    return [("router_replay", RouterReplayConfig)]


@hookimpl
def graft_auto_settings(cfg: Any) -> dict[str, Any] | None:
    """R3 with the embedded engine records routing on the generating model: ``rollout.decode``
    left to `auto` decodes with it (``dynamic``) instead of the static copy."""
    if replay_mode(cfg) == R3 and cfg.rollout.engine == "embedded":
        return {"rollout.decode": "dynamic"}
    return None


@hookimpl
def graft_pre_shard(model: Any, cfg: Any, mesh: Any, role: str) -> None:
    """Hook the policy's routers (the frozen reference keeps its own routing); the step's
    counts are summed over ``mesh``'s ranks on its device."""
    if role != "policy":
        return
    from graft_router_replay.session import start_session, stop_session

    mode = replay_mode(cfg)
    if mode == DISABLED:
        stop_session()
        return
    if (conflict := run_conflict(cfg, mode)) is not None:
        from graft.errors import ConfigError

        raise ConfigError(conflict)
    start_session(model, mode, mesh)


@hookimpl
def graft_step_begin() -> None:
    """Nothing recorded yet this step; counters at zero."""
    if (session := _session()) is not None:
        session.begin_step()


@hookimpl
def graft_rollout_begin(rollout: Any) -> None:
    """R3: start recording the rollout's routing."""
    if (session := _session()) is not None:
        session.begin_rollout(rollout)


@hookimpl
def graft_rollout_end(samples: list[Any]) -> None:
    """R3: each sample's routes as per-token extras (packed into every micro-batch)."""
    if (session := _session()) is not None:
        session.end_rollout(samples)


@hookimpl
def graft_prepare_inputs(batch: dict[str, Any], layout: Any, phase: str, shard: Any) -> None:
    """Record, replay or route natively in this forward (on ``shard``'s tokens: this rank's
    part of every row under sequence parallelism)."""
    if (session := _session()) is not None:
        session.prepare(batch, layout, phase, shard)


@hookimpl
def graft_post_forward(layout: Any, shard: Any) -> dict[str, Any] | None:
    """Keep what the forward recorded (R2's old-log-prob pass) for the update passes."""
    if (session := _session()) is not None:
        return session.finish(layout, shard)
    return None


@hookimpl
def graft_step_end(metrics: dict[str, float]) -> None:
    """``router_replay/mismatch_fraction``, ``fallback_rows`` and ``bytes_per_token``."""
    if (session := _session()) is not None:
        metrics.update(session.step_metrics())


def _session() -> Any:
    """The session of the model being trained, or None (replay disabled)."""
    from graft_router_replay.session import active_session  # torch: imported during runs only

    return active_session()
