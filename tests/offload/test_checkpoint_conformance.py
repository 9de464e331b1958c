"""graft-offload through the conformance kit's real-checkpoint leg: ``graft train`` from a saved
tiny checkpoint (``model.path``: meta build, shard, broadcast fill) on 1 and 2 gloo ranks, with
the CPU stand-in for the device (tests/plugins/graft_offload_standin_plugin), reports the
offload's metrics every step and the same results as the same run on the preset."""

from __future__ import annotations

from pathlib import Path

import pytest

from graft.testing.checkpoint import check_plugin_on_checkpoint

OFFLOAD = ["trainer.mode=sft", "engine.activation_checkpointing=true",
           "features.offload.enabled=true", "features.offload.min_tensor_mb=0"]


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [1, 2])
def test_offload_runs_from_a_checkpoint(plugin_sites: dict[str, Path], tmp_path: Path,
                                        nproc: int) -> None:
    check_plugin_on_checkpoint(preset="tiny-llama", overrides=OFFLOAD,
                               expect_metrics=["offload/offloaded_gb", "offload/host_gb"],
                               nproc=nproc, tmp_path=tmp_path, compare_preset=nproc == 2,
                               env={"PYTHONPATH": str(plugin_sites["offload_standin"])})
