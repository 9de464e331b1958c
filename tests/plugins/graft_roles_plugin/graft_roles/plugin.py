"""``graft_rank_roles``: with more than one rank, the last one gets the role ``helper``;
``graft_role_runner``: the helper writes what it was given to ``<run_dir>/helper-<rank>.json``
and returns, without building a model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from graft import hookimpl

HELPER = "helper"


@hookimpl
def graft_rank_roles(cfg: Any, world_size: int) -> dict[str, list[int]] | None:
    """The trainers (every rank but the last) and one helper (the last); one rank: no roles."""
    if world_size < 2:
        return None
    return {"trainer": list(range(world_size - 1)), HELPER: [world_size - 1]}


@hookimpl
def graft_role_runner(role: str, cfg: Any, env: Any, run_dir: Any) -> Any:
    """The helper's runner: a record of its role, env and run directory."""
    if role != HELPER:
        return None

    def run() -> None:
        import torch.distributed as dist

        record = {"role": env.role, "rank": env.rank, "world_size": env.world_size,
                  "role_ranks": list(env.role_ranks), "global_rank": dist.get_rank(),
                  "group_size": dist.get_world_size(env.group), "is_main": env.is_main,
                  "total_steps": cfg.trainer.total_steps, "run_dir": str(run_dir)}
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        (Path(run_dir) / f"helper-{dist.get_rank()}.json").write_text(json.dumps(record))

    return run
