"""``graft train`` in RL mode (the default): learning, several ranks, KL, interrupt and resume."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from statistics import mean

import pytest

SMALL = ("rollout.prompts_per_step=4", "rollout.n=4")


@pytest.mark.slow
def test_default_rl_run_improves_the_reward(graft_train, metrics_of, tmp_path: Path) -> None:
    # The README's default run, shortened: 40 of its 200 steps, same settings otherwise.
    graft_train(tmp_path, "trainer.total_steps=40")
    rows = metrics_of(tmp_path)
    assert all("reward_mean" in r and "train_infer_logprob_diff" in r for r in rows)
    first, last = mean(r["reward_mean"] for r in rows[:5]), mean(r["reward_mean"] for r in rows[-5:])
    assert last > first + 0.05, (first, last)
    assert max(r["train_infer_logprob_diff"] for r in rows) < 1e-5  # same model: fp32 rounding
    assert (tmp_path / "hf" / "model.safetensors").is_file()


@pytest.mark.slow
def test_rl_on_two_gloo_ranks_with_kl_to_a_reference(graft_train, metrics_of,
                                                     tmp_path: Path) -> None:
    graft_train(tmp_path, "trainer.total_steps=3", *SMALL, "loss.kl_coef=0.1",
          "algorithm.advantage=rloo", "algorithm.mini_batches=2", nproc=2)
    rows = metrics_of(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all("kl" in r and r["kl"] >= 0 for r in rows) and rows[0]["kl"] < 1e-6
    assert rows[-1]["kl"] > 0, "the policy moved away from the reference"


@pytest.mark.slow
def test_interrupted_run_resumes_when_the_command_is_rerun(live_graft, metrics_of,
                                                          tmp_path: Path) -> None:
    # No trainer.run_dir: rerunning the same command finds the unfinished run under runs/.
    args = ["train", "trainer.total_steps=12", "checkpoint.every_steps=2", *SMALL]
    first = live_graft(args, cwd=tmp_path)
    first.wait_for(r"saved checkpoint \S+/step_4$")  # the run's own word, not a wall-clock guess
    first.interrupt()  # Ctrl-C
    assert first.finish() == 130, first.output[-3000:]
    (run_dir,) = tmp_path.glob("runs/*")
    interrupted_at = len(metrics_of(run_dir))
    assert 4 <= interrupted_at < 12
    latest = (run_dir / "checkpoints" / "latest").read_text().strip()
    resumes_from = Path("runs") / run_dir.name / "checkpoints" / latest
    assert (f"graft: interrupted; rerun the same command to resume from {resumes_from}\n"
            in first.output)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRAFT_")}
    second = subprocess.run([sys.executable, "-m", "graft", *args], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=1200)  # a hang's guard
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from" in second.stderr
    assert list(tmp_path.glob("runs/*")) == [run_dir], "same run directory, no new one"
    assert [r["step"] for r in metrics_of(run_dir)] == list(range(1, 13))


@pytest.mark.slow
def test_ranks_agree_on_the_micro_batch_count_when_the_planner_needs_more(graft_train,
                                                                         tmp_path: Path) -> None:
    """With a small token budget the planner can return more micro-batches than the count the
    ranks agreed on; every rank must then run the same agreement rounds (this hung before)."""
    graft_train(tmp_path, "trainer.total_steps=2", "algorithm.mini_batches=2",
                "engine.max_tokens_per_micro_batch=64", "checkpoint.every_steps=0",
                "export.hf_at_end=false", nproc=2)
