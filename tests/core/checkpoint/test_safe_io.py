"""`dcp_failures` around real DCP saves: a failure becomes a `CheckpointError`, a Ctrl-C stays
an interrupt."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from graft.checkpoint.safe_io import dcp_failures
from graft.errors import CheckpointError


class FailingWriter(dcp.FileSystemWriter):
    """Writes nothing: raises ``failure`` where DCP writes the shards."""

    def __init__(self, path: Path, failure: BaseException) -> None:
        super().__init__(path)
        self.failure = failure

    def write_data(self, plan, planner):  # noqa: ANN001, ANN201 - DCP's own signature
        raise self.failure


def test_a_failed_save_is_a_checkpoint_error_naming_its_cause(tmp_path: Path) -> None:
    writer = FailingWriter(tmp_path, OSError("disk full"))
    with pytest.raises(CheckpointError, match="saving step 3 failed: OSError: disk full. Kept."):
        with dcp_failures("saving step 3", note="Kept."):
            dcp.save({"w": torch.ones(2)}, storage_writer=writer)


def test_a_ctrl_c_during_a_save_is_an_interrupt_not_a_checkpoint_error(tmp_path: Path) -> None:
    """DCP catches the KeyboardInterrupt on the rank it hit; Graft's CLI must see an interrupt
    (and say how to resume), not a broken checkpoint."""
    writer = FailingWriter(tmp_path, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        with dcp_failures("saving step 3"):
            dcp.save({"w": torch.ones(2)}, storage_writer=writer)
