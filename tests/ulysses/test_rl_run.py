"""A 3-step RL run with rows split over 2 ranks (sp=2): through the conformance kit's
real-checkpoint leg (``model.path``: meta build, shard, broadcast fill) and from the preset,
both reporting the plugin's metric every step and agreeing exactly; and the same run on one
rank without sequence parallelism trains the same (rollout on whole sequences on every rank,
only the update split): the same rewards and response lengths, and losses and gradient norms
within fp32 summation order; and so does sp=2 composed with activation checkpointing,
graft-offload (its CPU stand-in for the device) and chunked log-probs (8 tokens at a time)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from graft.testing.checkpoint import check_plugin_on_checkpoint, run_graft_train, small_run

SPLIT = ["features.ulysses.sp_size=2"]


COMPOSED = ["engine.activation_checkpointing=true", "features.offload.enabled=true",
            "features.offload.min_tensor_mb=0", "engine.logprob_chunk_tokens=8"]


def assert_trains_alike(one: list[dict], split: list[dict]) -> None:
    assert len(one) == len(split) == 3
    for a, b in zip(one, split, strict=True):
        for name in ("reward_mean", "response_length", "tokens"):
            assert a[name] == b[name], (a["step"], name, a[name], b[name])
        for name in ("loss", "grad_norm", "entropy"):
            assert math.isclose(a[name], b[name], rel_tol=1e-5, abs_tol=1e-6), (
                a["step"], name, a[name], b[name])


@pytest.mark.slow
def test_rl_with_sp2_runs_from_a_checkpoint_and_trains_like_one_rank(
        plugin_sites: dict[str, Path], tmp_path: Path) -> None:
    _, split = check_plugin_on_checkpoint(preset="tiny-llama", overrides=SPLIT,
                                          expect_metrics=["ulysses/all_to_all_gb"], nproc=2,
                                          tmp_path=tmp_path)
    # One rank, the same 4 prompts a step (sp=2 on 2 ranks is one data-parallel rank).
    one = run_graft_train([*small_run(2, 3, 0), "model.preset=tiny-llama"], tmp_path / "one")
    assert all("ulysses/all_to_all_gb" not in row for row in one)
    assert_trains_alike(one, split)
    composed = run_graft_train([*small_run(2, 3, 0), "model.preset=tiny-llama", *SPLIT,
                                *COMPOSED], tmp_path / "composed", nproc=2,
                               env={"PYTHONPATH": str(plugin_sites["offload_standin"])})
    assert all(row["offload/offloaded_gb"] > 0 and row["ulysses/all_to_all_gb"] > 0
               for row in composed)
    assert_trains_alike(one, composed)
