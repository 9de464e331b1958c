"""Rollout workers run what a trainer's rollout runs: an environment's multi-turn episodes
(graft-multiturn with graft-calculator's tool) scored in graft-reward-pool's process pool."""

from __future__ import annotations

from pathlib import Path

import pytest
from graft_calculator import write_problems

from tests.async_rl.test_async_rl import RUN, workers
from tests.calculator.conftest import calculator_checkpoint


@pytest.mark.slow
def test_workers_run_an_environments_episodes_scored_in_a_process_pool(
        graft_train, metrics_of, tmp_path: Path) -> None:
    model = calculator_checkpoint(tmp_path / "model")
    data = write_problems(tmp_path / "train.jsonl", 64, seed=0, max_operand=9, operators="+")
    graft_train(tmp_path / "run", *RUN, f"model.path={model}", "data.source=file",
                f"data.path={data}", "features.multiturn.environment=calculator",
                "features.calculator.format=calc", "features.multiturn.max_turns=2",
                "features.multiturn.max_episode_tokens=16", "rollout.max_new_tokens=6",
                "rollout.prompts_per_step=4", "rollout.n=4", "features.reward_pool.workers=2",
                "features.reward_pool.kind=process", "trainer.total_steps=3",
                "checkpoint.every_steps=0", *workers(1, 1), nproc=3)
    rows = metrics_of(tmp_path / "run")
    assert [row["async_rl/staleness_max"] for row in rows] == [0.0, 1.0, 1.0]
    for row in rows:  # the worker's episodes: their turns and tool calls, its pool's counts
        assert row["rollout/turns_mean"] >= 1.0
        assert "rollout/tool_calls_mean" in row and "reward_timeouts" in row, sorted(row)
