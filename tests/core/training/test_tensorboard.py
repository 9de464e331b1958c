"""``trainer.tensorboard=true``: event files tensorboard's own loader reads, each step once
after a resume; without the tensorboard package, a config error naming the pip command."""

from __future__ import annotations

from pathlib import Path

import pytest

SFT = ("trainer.mode=sft", "model.preset=tiny-llama", "trainer.tensorboard=true",
       "export.hf_at_end=false")


def scalars(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    """``(step, value)`` of ``tag``'s events, as TensorBoard shows them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    return [(event.step, event.value) for event in events.Scalars(tag)]


def scalar_steps(run_dir: Path, tag: str) -> list[int]:
    """The steps of ``tag``'s events."""
    return [step for step, _ in scalars(run_dir, tag)]


@pytest.mark.slow
def test_events_hold_each_step_once_after_a_resume(graft_train, metrics_of,
                                                   tmp_path: Path) -> None:
    # step 3 is logged, then done again after resuming from the step-2 checkpoint
    graft_train(tmp_path, *SFT, "trainer.total_steps=3", "checkpoint.every_steps=2",
                "checkpoint.save_at_end=false")
    assert scalar_steps(tmp_path, "loss") == [1, 2, 3]
    graft_train(tmp_path, *SFT, "trainer.total_steps=4", "checkpoint.every_steps=2")
    assert scalar_steps(tmp_path, "loss") == [1, 2, 3, 4]
    # the values of metrics.jsonl, the redone step's included (stored as float32)
    for tag in ("loss", "grad_norm", "tokens_per_s"):
        assert scalars(tmp_path, tag) == [
            (row["step"], pytest.approx(row[tag], rel=1e-6)) for row in metrics_of(tmp_path)]


def test_without_tensorboard_the_run_is_refused_with_the_pip_command(run_graft, site_without,
                                                                     tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    result = run_graft(["train", f"trainer.run_dir={run_dir}", "trainer.total_steps=2", *SFT],
                       site=site_without("tensorboard"))
    assert result.returncode == 2, result.stderr[-3000:]
    assert "trainer.tensorboard=true" in result.stderr
    assert "`pip install tensorboard`" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (run_dir / "metrics.jsonl").exists() and not (run_dir / "config.yaml").exists()
