"""The Python entry point for library users: ``graft.train(cfg)``."""

from __future__ import annotations

from typing import Any


def train(cfg: Any = None, *, overrides: tuple[str, ...] | list[str] = ()) -> list[dict[str, Any]]:
    """Train with ``cfg`` (a config from `graft.config.compose`), or compose one from
    ``overrides``; return the per-step metrics. Works in one process or under torchrun
    (``graft train`` calls it on every rank); the process group is shut down when it returns
    or raises."""
    from graft.config import compose
    from graft.engine.distributed import shutdown_distributed
    from graft.training.trainer import Trainer

    config = cfg if cfg is not None else compose(list(overrides))
    try:
        return Trainer(config).fit()
    finally:
        shutdown_distributed()
