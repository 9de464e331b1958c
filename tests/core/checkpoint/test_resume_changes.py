"""Rerunning a run directory with another config: a rejected resume says why (the mismatch
first, no backfill message) and leaves config.yaml as it was; an accepted one says what
changed and applies it; a rerun of a finished run says it is complete and does nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

SFT = ("trainer.mode=sft", "model.preset=tiny-llama")
RL_TINY = ("rollout.prompts_per_step=1", "rollout.n=2", "rollout.max_new_tokens=4")


@pytest.mark.slow
def test_a_resume_with_another_model_is_refused_and_keeps_config_yaml(
        graft_train, run_graft, tmp_path: Path) -> None:
    graft_train(tmp_path, "trainer.total_steps=2", *SFT)
    written = (tmp_path / "config.yaml").read_text()

    result = run_graft(["train", f"trainer.run_dir={tmp_path}", "trainer.total_steps=4",
                        "trainer.mode=sft", "model.preset=tiny-qwen3-moe"])

    assert result.returncode == 2, result.stderr[-3000:]
    assert (tmp_path / "config.yaml").read_text() == written
    error = result.stderr.split("graft: error: ")[1]
    assert "has no parameter 'model.layers.0.self_attn.q_norm.weight'" in error
    assert "model.preset: tiny-llama -> tiny-qwen3-moe" in error
    assert "optimizer state" not in result.stderr and "backfilled" not in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_changed_settings_are_said_and_applied_and_a_finished_run_is_left_alone(
        graft_train, metrics_of, tmp_path: Path) -> None:
    graft_train(tmp_path, "trainer.total_steps=2", *RL_TINY)
    changed = ("trainer.total_steps=3", *RL_TINY, "optim.lr=0.002", "rollout.n=4")

    resumed = graft_train(tmp_path, *changed)

    said = resumed.stderr.split("resuming with settings changed since ")[1].splitlines()[0]
    for change in ("optim.lr: 0.001 -> 0.002", "rollout.n: 2 -> 4", "trainer.total_steps: 2 -> 3"):
        assert change in said
    rows = metrics_of(tmp_path)
    assert [row["lr"] for row in rows] == [0.001, 0.001, 0.002]
    config = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert config["optim"]["lr"] == 0.002 and config["rollout"]["n"] == 4
    exported = (tmp_path / "hf" / "model.safetensors").stat().st_mtime_ns

    again = graft_train(tmp_path, *changed)

    assert f"{tmp_path} is complete" in again.stdout
    assert "exported" not in again.stderr and "time to first step" not in again.stdout
    assert metrics_of(tmp_path) == rows
    assert (tmp_path / "hf" / "model.safetensors").stat().st_mtime_ns == exported
