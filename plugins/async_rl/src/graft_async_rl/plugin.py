"""graft-async-rl's hooks (no torch here: Graft imports this module for every command): its
config section and rules, the ranks' roles, the rollout workers' runner and the trainers'
experience source."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from graft import hookimpl
from graft.config import was_set
from graft.errors import ConfigError
from graft_async_rl.config import AsyncRLConfig
from graft_async_rl.roles import WORKER_PREFIX, split_ranks

SECTION = "async_rl"


@hookimpl
def graft_config_sections() -> list[tuple[str, type]]:
    """``features.async_rl`` (`AsyncRLConfig`)."""
    return [(SECTION, AsyncRLConfig)]


def seeded_sampling_with_workers(cfg: Any, user_keys: Collection[str]) -> None:
    """With workers, each sample is drawn with its own seed unless the user chose otherwise:
    a sample's tokens then do not depend on which worker draws it, nor on a resume."""
    if cfg.features.async_rl.workers and not was_set("rollout.seeded_sampling", user_keys):
        cfg.rollout.seeded_sampling = True


def correction_with_staleness(cfg: Any, user_keys: Collection[str]) -> None:
    """With workers that may generate with older weights (``max_staleness`` > 0), the policy
    loss is corrected by truncated importance sampling (``algorithm.rollout_correction=tis``)
    unless the user chose a correction (``none`` included)."""
    settings = cfg.features.async_rl
    if (settings.workers and settings.max_staleness > 0
            and not was_set("algorithm.rollout_correction", user_keys)):
        cfg.algorithm.rollout_correction = "tis"


def check_async_config(cfg: Any) -> None:
    """`ConfigError` for settings the workers cannot serve."""
    if not cfg.features.async_rl.workers:
        return
    if cfg.trainer.mode != "rl":
        raise ConfigError(f"features.async_rl.workers needs trainer.mode=rl (got "
                          f"{cfg.trainer.mode!r}); set features.async_rl.workers=0")
    if cfg.trainer.val_every_steps and cfg.data.val_path:
        raise ConfigError("features.async_rl.workers: validation runs on the trainers' own "
                          "rollout engine, which a run with workers does not start; set "
                          "trainer.val_every_steps=0 (or features.async_rl.workers=0)")


@hookimpl
def graft_config_rules() -> list[Any]:
    """Seeded sampling and (with staleness) a correction by default with workers; what they
    cannot serve is an error."""
    return [seeded_sampling_with_workers, correction_with_staleness, check_async_config]


@hookimpl
def graft_rank_roles(cfg: Any, world_size: int) -> dict[str, list[int]] | None:
    """The trainers and ``features.async_rl.workers`` rollout workers (the last ranks)."""
    workers = cfg.features.async_rl.workers
    return split_ranks(world_size, workers) if workers else None


@hookimpl
def graft_role_runner(role: str, cfg: Any, env: Any, run_dir: Any) -> Any:
    """A rollout worker's loop for the roles ``rollout.<index>``."""
    if not role.startswith(WORKER_PREFIX):
        return None
    from graft_async_rl.worker import RolloutWorker

    return RolloutWorker(role=role, cfg=cfg, env=env, run_dir=run_dir).run


@hookimpl
def graft_experience_source(cfg: Any, job: Any, engine: Any, env: Any) -> Any:
    """The workers' samples on the trainers, when there are workers."""
    if not cfg.features.async_rl.workers:
        return None
    from graft_async_rl.source import WorkerSource

    return WorkerSource(cfg=cfg, job=job, engine=engine, env=env)
