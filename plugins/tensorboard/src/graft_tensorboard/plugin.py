"""graft-tensorboard's hooks (no tensorboard here: Graft imports this module for every command):
its config section, the pre-flight check that tensorboard is installed, and the event files
opened when training begins, written at every step's end and closed at the run's end, on the
main rank only."""

from __future__ import annotations

import atexit
from pathlib import Path
from typing import Any

from graft import hookimpl
from graft_tensorboard.config import (
    SECTION,
    TensorBoardConfig,
    require_tensorboard,
    tensorboard_section,
)

# This process's event files while it trains (the main rank with features.tensorboard.enabled).
_active: dict[str, Any] = {}


@hookimpl
def graft_config_sections() -> list[tuple[str, type]]:
    """``features.tensorboard`` (`TensorBoardConfig`)."""
    return [(SECTION, TensorBoardConfig)]


@hookimpl
def graft_preflight(cfg: Any) -> None:
    """``features.tensorboard.enabled=true`` without the tensorboard package: refused before any
    rank starts, naming the pip command."""
    if tensorboard_section(cfg).enabled:
        require_tensorboard()


@hookimpl
def graft_train_begin(cfg: Any, run_dir: Any, is_main: bool, start_step: int,
                      metrics: dict[str, float]) -> None:
    """Open the event files on the main rank (superseding the steps after ``start_step``), and
    write step 0's record (the first validation) when there is one."""
    _close()  # a run of this process that ended with an error left its files open
    if not (tensorboard_section(cfg).enabled and is_main):
        return
    from graft_tensorboard.events import TensorBoardEvents

    events = _active["events"] = TensorBoardEvents(Path(run_dir), start_step)
    if metrics:
        events.log(0, metrics)


@hookimpl(trylast=True)  # after the plugins that add their own metrics to the step's
def graft_step_end(step: int, metrics: dict[str, float]) -> None:
    """Write the step's metrics."""
    if "events" in _active:
        _active["events"].log(step, metrics)


@hookimpl
def graft_train_end() -> None:
    """Close the event files."""
    _close()


@atexit.register  # a run that fails: its events are flushed when the process exits
def _close() -> None:
    events = _active.pop("events", None)
    if events is not None:
        events.close()
