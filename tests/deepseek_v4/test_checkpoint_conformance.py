"""graft-deepseek-v4's QAT through the conformance kit's real-checkpoint leg: SFT from a saved
tiny DeepSeek-V4 checkpoint (``model.path``: meta build, shard, broadcast fill) on 1 and 2 gloo
ranks quantises the weights every step, with the same results as the same run on the preset."""

from __future__ import annotations

from pathlib import Path

import pytest

from graft.testing.checkpoint import check_plugin_on_checkpoint

QAT = ["trainer.mode=sft", "features.deepseek_v4.qat=fp8_blockwise"]


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [1, 2])
def test_qat_runs_from_a_checkpoint(tmp_path: Path, nproc: int) -> None:
    from_path, _ = check_plugin_on_checkpoint(
        preset="tiny-deepseek-v4", overrides=QAT, expect_metrics=["deepseek_v4/qat_weight_passes"],
        nproc=nproc, tmp_path=tmp_path, compare_preset=nproc == 2)
    assert all(row["deepseek_v4/qat_weight_passes"] >= 1 for row in from_path), from_path
