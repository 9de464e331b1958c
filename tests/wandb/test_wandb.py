"""graft-wandb: a real tiny run's metrics and config in a real W&B run (offline), read back
from the files W&B wrote; a resumed run continues the same W&B run with each step once."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import graft
import graft_wandb.plugin as plugin
from graft.errors import ConfigError
from graft_wandb import STATE_FILE

# features.wandb.mode is left to auto: WANDB_MODE=offline (the fixture's) is W&B's mode
RUN = ("trainer.mode=sft", "model.preset=tiny-llama", "engine.device=cpu",
       "export.hf_at_end=false", "features.wandb.enabled=true")


def train(run_dir: Path, *overrides: str) -> list[dict]:
    return graft.train(graft.compose([f"trainer.run_dir={run_dir}", *RUN, *overrides]))


def steps(run: dict) -> list[int]:
    return [row["_step"] for row in run["history"]]


def metrics_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_every_step_goes_to_wandb_at_its_graft_step_with_the_config(tmp_path: Path,
                                                                    wandb_runs) -> None:
    held_out = tmp_path / "val.jsonl"
    held_out.write_text('{"prompt": "say ab:", "response": "abababab"}\n')
    run_dir = tmp_path / "run"
    train(run_dir, "trainer.total_steps=3", f"data.val_path={held_out}",
          "trainer.val_every_steps=2", "features.wandb.mode=offline",
          "features.wandb.tags=[sft,tiny]", "features.wandb.project=curves")
    (run,) = wandb_runs(run_dir)
    rows = metrics_rows(run_dir)
    # step 0 is the first validation, before the first step, as in metrics.jsonl
    assert steps(run) == [row["step"] for row in rows] == [0, 1, 2, 3]
    for logged, row in zip(run["history"], rows, strict=True):
        for key in ("loss", "grad_norm", "val/loss"):
            assert logged.get(key) == row.get(key), (row["step"], key)
    assert run["name"] == "run" and run["tags"] == ["sft", "tiny"]
    assert run["project"] == "curves"
    assert run["config"]["trainer"]["total_steps"] == 3
    assert run["config"]["features"]["wandb"]["mode"] == "offline"
    assert json.loads((run_dir / STATE_FILE).read_text()) == {"id": run["id"], "last_step": 3}


def test_a_resumed_run_continues_its_wandb_run_with_each_step_once(tmp_path: Path,
                                                                   wandb_runs) -> None:
    run_dir = tmp_path / "run"
    checkpoints = ("checkpoint.every_steps=2", "checkpoint.save_at_end=false")
    train(run_dir, "trainer.total_steps=3", *checkpoints)  # step 3 is logged, not saved
    train(run_dir, "trainer.total_steps=4", *checkpoints)  # resumes from step 2
    first, resumed = wandb_runs(run_dir)
    assert resumed["id"] == first["id"] and first["project"] == "graft"
    assert steps(first) + steps(resumed) == [1, 2, 3, 4]
    assert [row["step"] for row in metrics_rows(run_dir)] == [1, 2, 3, 4]
    # without a checkpoint the run starts over (metrics.jsonl too): a new W&B run
    shutil.rmtree(run_dir / "checkpoints")
    train(run_dir, "trainer.total_steps=2", "checkpoint.save_at_end=false")
    *_, again = wandb_runs(run_dir)
    assert again["id"] != first["id"] and steps(again) == [1, 2]


@pytest.mark.parametrize("overrides,is_main", [([], True), (["features.wandb.enabled=true"], False)])
def test_nothing_is_logged_by_default_nor_off_the_main_rank(tmp_path: Path, overrides: list[str],
                                                            is_main: bool) -> None:
    cfg = graft.compose([f"trainer.run_dir={tmp_path}", *overrides])
    plugin.graft_train_begin(cfg=cfg, run_dir=tmp_path, is_main=is_main, start_step=0,
                             metrics={"val/loss": 1.0})
    plugin.graft_step_end(step=1, metrics={"loss": 1.0})
    plugin.graft_train_end()
    assert list(tmp_path.iterdir()) == []


def test_without_wandb_the_run_is_refused_with_the_pip_command(run_graft, site_without,
                                                               tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    result = run_graft(["train", f"trainer.run_dir={run_dir}", "trainer.total_steps=1", *RUN],
                       site=site_without("wandb"))
    assert result.returncode == 2, result.stderr[-3000:]
    assert "features.wandb.enabled=true" in result.stderr
    assert "`pip install wandb`" in result.stderr
    assert "Traceback" not in result.stderr
    assert not run_dir.exists()


def test_online_without_a_login_is_a_clear_error(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.netrc holding a W&B key
    with pytest.raises(ConfigError, match="W&B could not start the run .*`wandb login`"):
        train(tmp_path / "run", "trainer.total_steps=1", "features.wandb.mode=online")
