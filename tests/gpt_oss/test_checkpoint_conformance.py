"""graft-gpt-oss through the conformance kit's real-checkpoint leg: SFT from a saved tiny GPT-OSS
checkpoint (``model.path``: meta build, shard, broadcast fill) on 1 rank and on 2 gloo ranks
with the experts split over them (``engine.ep_size=2``), with the same results as the same run
on the preset."""

from __future__ import annotations

from pathlib import Path

import pytest

from graft.testing.checkpoint import check_plugin_on_checkpoint


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [1, 2])
def test_gpt_oss_trains_from_a_checkpoint(tmp_path: Path, nproc: int) -> None:
    check_plugin_on_checkpoint(preset="tiny-gpt-oss",
                               overrides=["trainer.mode=sft", f"engine.ep_size={nproc}"],
                               expect_metrics=["loss", "grad_norm"], nproc=nproc,
                               tmp_path=tmp_path, compare_preset=nproc == 2)
