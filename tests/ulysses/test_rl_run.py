"""A 3-step RL run with rows split over 2 ranks (sp=2): through the conformance kit's
real-checkpoint leg (``model.path``: meta build, shard, broadcast fill) and from the preset,
both reporting the plugin's metric every step and agreeing exactly; and the same run on one
rank without sequence parallelism trains the same (rollout on whole sequences on every rank,
only the update split): the same rewards and response lengths, and losses and gradient norms
within fp32 summation order."""

from __future__ import annotations

import math
from pathlib import Path

from graft.testing.checkpoint import check_plugin_on_checkpoint, run_graft_train, small_run

SPLIT = ["features.ulysses.sp_size=2"]


def test_rl_with_sp2_runs_from_a_checkpoint_and_trains_like_one_rank(tmp_path: Path) -> None:
    _, split = check_plugin_on_checkpoint(preset="tiny-llama", overrides=SPLIT,
                                          expect_metrics=["ulysses/all_to_all_gb"], nproc=2,
                                          tmp_path=tmp_path)
    # One rank, the same 4 prompts a step (sp=2 on 2 ranks is one data-parallel rank).
    one = run_graft_train([*small_run(2, 3, 0), "model.preset=tiny-llama"], tmp_path / "one")
    assert len(one) == len(split) == 3
    for a, b in zip(one, split, strict=True):
        assert "ulysses/all_to_all_gb" not in a
        for name in ("reward_mean", "response_length", "tokens"):
            assert a[name] == b[name], (a["step"], name, a[name], b[name])
        for name in ("loss", "grad_norm", "entropy"):
            assert math.isclose(a[name], b[name], rel_tol=1e-5, abs_tol=1e-6), (
                a["step"], name, a[name], b[name])
