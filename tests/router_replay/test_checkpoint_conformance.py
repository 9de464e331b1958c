"""graft-router-replay through the conformance kit's real-checkpoint leg: RL with R2 and R3 from
a saved tiny Qwen3-MoE checkpoint (``model.path``: meta build, shard, broadcast fill) on 1 and 2
gloo ranks replays routes every step (its metrics, stored routes) with the same results as the
same run on the preset."""

from __future__ import annotations

from pathlib import Path

import pytest

from graft.testing.checkpoint import COMPARED, check_plugin_on_checkpoint

METRICS = ["router_replay/mismatch_fraction", "router_replay/fallback_rows",
           "router_replay/bytes_per_token"]
# Two mini-batches: the old-log-prob pass runs (R2 records there) before the updates replay.
RL = ["model.preset=tiny-qwen3-moe", "algorithm.mini_batches=2",
      "engine.max_tokens_per_micro_batch=48"]


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [1, 2])
@pytest.mark.parametrize("mode", ["R2", "R3"])
def test_routing_replay_runs_from_a_checkpoint(tmp_path: Path, mode: str, nproc: int) -> None:
    from_path, _ = check_plugin_on_checkpoint(
        preset="tiny-qwen3-moe", overrides=[*RL, f"features.router_replay.mode={mode}"],
        expect_metrics=METRICS, nproc=nproc, tmp_path=tmp_path, compare_preset=nproc == 2,
        compared=[*COMPARED, *METRICS])
    assert all(row["router_replay/bytes_per_token"] > 0 for row in from_path), from_path
