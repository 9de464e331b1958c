"""`TensorBoardEvents`: the TensorBoard event files of one Graft run, each step once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from graft_tensorboard.config import require_tensorboard

# Under the run directory: the event files.
EVENTS_DIR = "tensorboard"


class TensorBoardEvents:
    """Writes each step's numeric metrics as scalars to ``<run_dir>/tensorboard``, at
    TensorBoard step = the Graft step.

    ``start_step``: the step training continues after (0 for a new run, or one that starts
    over). The events of the steps after it, written before by an attempt that stopped, are
    superseded (TensorBoard's ``purge_step``): a resumed run purges from ``start_step + 1``, a
    new run everything (step 0 on), so each step appears once with the values metrics.jsonl
    holds.
    """

    def __init__(self, run_dir: Path, start_step: int) -> None:
        require_tensorboard()
        from torch.utils.tensorboard import SummaryWriter

        purge = start_step + 1 if start_step > 0 else 0
        self.writer = SummaryWriter(str(run_dir / EVENTS_DIR), purge_step=purge)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """Write ``metrics``' numbers (``step`` itself left out) as scalars at ``step``."""
        for key, value in metrics.items():
            if isinstance(value, (int, float)) and key != "step":
                self.writer.add_scalar(key, value, step)

    def close(self) -> None:
        """Flush the events and close the files."""
        self.writer.close()
