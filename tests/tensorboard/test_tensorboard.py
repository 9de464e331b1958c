"""graft-tensorboard: a real tiny run's event files, read back with tensorboard's own loader:
each step once after a resume, with metrics.jsonl's values, step 0's validation record; without
the tensorboard package, a config error naming the pip command."""

from __future__ import annotations

from pathlib import Path

import pytest

import graft
import graft_tensorboard.plugin as plugin
from graft_tensorboard import EVENTS_DIR

SFT = ("trainer.mode=sft", "model.preset=tiny-llama", "features.tensorboard.enabled=true",
       "export.hf_at_end=false")


def scalars(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    """``(step, value)`` of ``tag``'s events, as TensorBoard shows them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / EVENTS_DIR))
    events.Reload()
    return [(event.step, event.value) for event in events.Scalars(tag)]


def scalar_steps(run_dir: Path, tag: str) -> list[int]:
    """The steps of ``tag``'s events."""
    return [step for step, _ in scalars(run_dir, tag)]


def as_events(rows: list[dict], tag: str) -> list[tuple[int, object]]:
    """``(step, value)`` of ``tag`` in metrics.jsonl's rows that hold it (events store float32)."""
    return [(row["step"], pytest.approx(row[tag], rel=1e-6)) for row in rows if tag in row]


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
        assert scalars(tmp_path, tag) == as_events(metrics_of(tmp_path), tag)


@pytest.mark.slow
def test_step_0_holds_the_first_validation(graft_train, metrics_of, tmp_path: Path) -> None:
    held_out = tmp_path / "val.jsonl"
    held_out.write_text('{"prompt": "say ab:", "response": "abababab"}\n')
    run_dir = tmp_path / "run"
    graft_train(run_dir, *SFT, "trainer.total_steps=3", f"data.val_path={held_out}",
                "trainer.val_every_steps=2")
    rows = metrics_of(run_dir)
    assert [row["step"] for row in rows] == [0, 1, 2, 3]
    assert scalar_steps(run_dir, "val/loss") == [0, 2, 3]
    for tag in ("val/loss", "loss", "lr"):
        assert scalars(run_dir, tag) == as_events(rows, tag)


@pytest.mark.parametrize("overrides,is_main", [([], True),
                                               (["features.tensorboard.enabled=true"], False)])
def test_nothing_is_written_by_default_nor_off_the_main_rank(tmp_path: Path, overrides: list[str],
                                                             is_main: bool) -> None:
    cfg = graft.compose([f"trainer.run_dir={tmp_path}", *overrides])
    plugin.graft_train_begin(cfg=cfg, run_dir=tmp_path, is_main=is_main, start_step=0,
                             metrics={"val/loss": 1.0})
    plugin.graft_step_end(step=1, metrics={"step": 1, "loss": 1.0})
    plugin.graft_train_end()
    assert list(tmp_path.iterdir()) == []


def test_without_tensorboard_the_run_is_refused_with_the_pip_command(run_graft, site_without,
                                                                     tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    result = run_graft(["train", f"trainer.run_dir={run_dir}", "trainer.total_steps=2", *SFT],
                       site=site_without("tensorboard"))
    assert result.returncode == 2, result.stderr[-3000:]
    assert "features.tensorboard.enabled=true" in result.stderr
    assert "`pip install tensorboard`" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (run_dir / "metrics.jsonl").exists() and not (run_dir / "config.yaml").exists()
