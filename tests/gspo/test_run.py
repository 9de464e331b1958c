"""``graft train`` with graft-gspo: a short RL run on the tiny default model trains with
``loss.policy_loss=gspo`` and token-level rollout importance weights."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

RUN = ("trainer.total_steps=2", "rollout.prompts_per_step=4", "rollout.n=4",
       "rollout.max_new_tokens=16", "export.hf_at_end=false", "checkpoint.save_at_end=false",
       "loss.policy_loss=gspo", "loss.clip_ratio_low=3e-4", "loss.clip_ratio_high=4e-4",
       "features.gspo.rollout_is=token", "algorithm.mini_batches=2")


@pytest.mark.slow
def test_an_rl_run_with_gspo_and_rollout_weights_trains(graft_train, metrics_of,
                                                        tmp_path: Path) -> None:
    graft_train(tmp_path, *RUN)
    rows = metrics_of(tmp_path)
    assert [row["step"] for row in rows] == [1, 2]
    for row in rows:
        # seq_ratio and rollout_is_weight are GSPO's own metrics: the plugin's loss ran, with
        # the weights of features.gspo (capped at rollout_is_cap, 2.0)
        assert math.isfinite(row["loss"]) and row["grad_norm"] > 0
        assert math.isfinite(row["seq_ratio"]) and row["seq_ratio"] > 0
        assert 0 < row["rollout_is_weight"] <= 2.0
    config = (tmp_path / "config.yaml").read_text()
    assert "gspo:\n    rollout_is: token" in config and "gspo_rollout_is" not in config
