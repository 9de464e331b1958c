"""graft-exact through the conformance kit's real-checkpoint leg: RL from a saved tiny checkpoint
(``model.path``: meta build, shard, broadcast fill; the kernels installed by ``graft_pre_shard``
and ``graft_inference_copy``) on 1 and 2 gloo ranks, the rollout's log-probs the trainer's bit
for bit on every step, and the same results as the same run on the preset."""

from __future__ import annotations

from pathlib import Path

import pytest

from graft.testing.checkpoint import COMPARED, check_plugin_on_checkpoint

METRICS = ["train_infer_logprob_diff", "train_infer_logprob_exact_fraction"]


@pytest.mark.slow  # graft train twice (1 rank) or once on 2 ranks, 3 steps each
@pytest.mark.parametrize(("preset", "decode", "nproc"), [
    ("tiny-llama", "static", 1), ("tiny-qwen3-moe", "dynamic", 2)])
def test_exact_runs_from_a_checkpoint(tmp_path: Path, preset: str, decode: str,
                                      nproc: int) -> None:
    from_path, from_preset = check_plugin_on_checkpoint(
        preset=preset, overrides=["features.exact.enabled=true", f"rollout.decode={decode}"],
        expect_metrics=METRICS, nproc=nproc, tmp_path=tmp_path, compare_preset=nproc == 1,
        compared=[*COMPARED, *METRICS])
    for row in [*from_path, *from_preset]:
        assert (row["train_infer_logprob_diff"], row["train_infer_logprob_exact_fraction"]) \
            == (0.0, 1.0), row
