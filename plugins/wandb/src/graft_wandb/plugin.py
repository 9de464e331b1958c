"""graft-wandb's hooks (no wandb here: Graft imports this module for every command): its config
section, the pre-flight check that wandb is installed, and the W&B run opened when training
begins, fed at every step's end and finished at the run's end, on the main rank only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from graft import hookimpl
from graft_wandb.config import SECTION, WandbConfig, require_wandb, wandb_section

# This process's W&B run while it trains (the main rank with features.wandb.enabled=true).
_active: dict[str, Any] = {}


@hookimpl
def graft_config_sections() -> list[tuple[str, type]]:
    """``features.wandb`` (`WandbConfig`)."""
    return [(SECTION, WandbConfig)]


@hookimpl
def graft_preflight(cfg: Any) -> None:
    """``features.wandb.enabled=true`` without the wandb package: refused before any rank
    starts, naming the pip command."""
    if wandb_section(cfg).enabled:
        require_wandb()


@hookimpl
def graft_train_begin(cfg: Any, run_dir: Any, is_main: bool, start_step: int,
                      metrics: dict[str, float]) -> None:
    """Open (or, resuming, continue) the W&B run on the main rank, and send step 0's record
    (the first validation) when there is one."""
    _finish()  # a run of this process that ended with an error left its W&B run open
    settings = wandb_section(cfg)
    if not (settings.enabled and is_main):
        return
    from graft_wandb.logger import WandbLogger

    logger = _active["logger"] = WandbLogger(cfg, settings, Path(run_dir), start_step)
    if metrics:
        logger.log(0, metrics)


@hookimpl(trylast=True)  # after the plugins that add their own metrics to the step's
def graft_step_end(step: int, metrics: dict[str, float]) -> None:
    """Send the step's metrics."""
    if "logger" in _active:
        _active["logger"].log(step, metrics)


@hookimpl
def graft_train_end() -> None:
    """Finish the W&B run."""
    _finish()


def _finish() -> None:
    logger = _active.pop("logger", None)
    if logger is not None:
        logger.finish()
