"""A run killed with ``kill -9`` before its first checkpoint and run again starts over and logs
each step once, in metrics.jsonl and samples.jsonl (a resumed run: test_rl_cli.py)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

# RL with one prompt of two answers a step, a sample line per step; the only checkpoint is the
# last step's (every_steps far away), so a kill at step 3 comes before any checkpoint.
TINY = ("rollout.prompts_per_step=1", "rollout.n=2", "rollout.max_new_tokens=4",
        "trainer.log_samples=1", "export.hf_at_end=false", "checkpoint.every_steps=1000")


def logged_steps(run_dir: Path, name: str) -> list[int]:
    """The ``step`` of every line of ``run_dir/name``, in file order."""
    return [json.loads(line)["step"] for line in (run_dir / name).read_text().splitlines()]


def kill_after_step(live_graft, run_dir: Path, step: int, *args: str) -> None:
    """Start ``graft train``; ``kill -9`` its process group once it printed step ``step``."""
    run = live_graft(["train", f"trainer.run_dir={run_dir}", *args], cwd=run_dir.parent)
    run.wait_for(rf"^step +{step}\D")
    os.killpg(run.process.pid, signal.SIGKILL)
    run.process.wait()


@pytest.mark.slow
def test_a_rerun_after_a_kill_before_the_first_checkpoint_logs_each_step_once(
        live_graft, graft_train, tmp_path: Path) -> None:
    run_dir = tmp_path / "dup"
    args = ("trainer.total_steps=12", *TINY)
    kill_after_step(live_graft, run_dir, 3, *args)
    assert not (run_dir / "checkpoints" / "latest").exists(), "killed after its checkpoint"
    assert logged_steps(run_dir, "metrics.jsonl")[:3] == [1, 2, 3]

    result = graft_train(run_dir, *args)  # the same command again, as the README advises

    assert logged_steps(run_dir, "metrics.jsonl") == list(range(1, 13))
    assert logged_steps(run_dir, "samples.jsonl") == list(range(1, 13))
    assert "starts over" in result.stderr

