"""graft-vllm through the conformance kit's real-checkpoint leg: RL with ``rollout.engine=vllm``
from a saved tiny Qwen3-MoE checkpoint (``model.path``: meta build, shard, broadcast fill) syncs
weights every step with the same results as the same run on the preset (one process: the
two-rank engine runs in tests/vllm/test_rl.py). The kit samples greedily (a tiny ``top_p``),
and vLLM reports log-probs after top-p (``processed_logprobs``: 0 for the one token kept), so
``train_infer_logprob_diff`` is compared between the legs here, not bounded."""

from __future__ import annotations

from pathlib import Path

import pytest

from graft.testing.checkpoint import check_plugin_on_checkpoint

pytestmark = pytest.mark.vllm


def test_the_vllm_engine_runs_from_a_checkpoint(requires_vllm: None, tmp_path: Path) -> None:
    from_path, _ = check_plugin_on_checkpoint(
        preset="tiny-qwen3-moe", overrides=["rollout.engine=vllm"],
        expect_metrics=["weight_sync_s", "weight_sync_mb"], nproc=1, tmp_path=tmp_path)
    assert all(row["weight_sync_mb"] > 0 for row in from_path), from_path
