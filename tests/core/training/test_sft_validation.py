"""SFT's held-out loss (``val/loss`` at RL's validation cadence, every rank scoring its share)
and epoch counter; validation never changes what training computes."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

import graft
from graft.data.tasks import generate_samples
from graft.testing.checkpoint import run_graft_train


def write_pairs(path: Path, count: int, seed: int) -> Path:
    """``count`` copy-task samples in Graft's SFT JSONL (prompt, response)."""
    path.write_text("".join(json.dumps({"prompt": s.prompt, "response": s.response}) + "\n"
                            for s in generate_samples("copy", count, seed=seed)))
    return path


@pytest.fixture
def data(tmp_path: Path) -> dict[str, Path]:
    return {"train": write_pairs(tmp_path / "train.jsonl", 8, seed=1),
            "val": write_pairs(tmp_path / "val.jsonl", 5, seed=2)}


def overrides(data: dict[str, Path], *extra: str) -> list[str]:
    return ["trainer.mode=sft", "model.preset=tiny-llama", "engine.device=cpu",
            "data.source=file", f"data.path={data['train']}", "trainer.global_batch_size=3",
            "trainer.total_steps=4", "checkpoint.save_at_end=false", "export.hf_at_end=false",
            *extra]


def train(run_dir: Path, options: list[str]) -> list[dict[str, Any]]:
    return graft.train(graft.compose([f"trainer.run_dir={run_dir}", *options]))


def test_val_loss_at_rls_cadence_and_training_unchanged(tmp_path: Path, data: dict[str, Path],
                                                        capsys: pytest.CaptureFixture) -> None:
    on = train(tmp_path / "on", overrides(data, f"data.val_path={data['val']}",
                                          "trainer.val_every_steps=2"))
    off = train(tmp_path / "off", overrides(data, f"data.val_path={data['val']}",
                                            "trainer.val_every_steps=0"))
    assert [row["step"] for row in on] == [0, 1, 2, 3, 4]
    assert [row["step"] for row in on if "val/loss" in row] == [0, 2, 4]
    assert all(math.isfinite(row["val/loss"]) and row["val/loss"] > 0
               for row in on if "val/loss" in row)
    assert "validation (step 2): loss " in capsys.readouterr().out
    assert not any("val/loss" in row for row in off)
    trained = [(row["loss"], row["grad_norm"]) for row in on if row["step"] > 0]
    assert trained == [(row["loss"], row["grad_norm"]) for row in off]  # bit-identical
    assert on[-1]["val/loss"] < on[0]["val/loss"]  # the held-out copies are learned too


def test_val_loss_is_the_mean_nll_per_trained_token(tmp_path: Path,
                                                    data: dict[str, Path]) -> None:
    # The held-out set is the training set, one step takes all of it: step 1's loss (token-mean,
    # before its update) and the step-0 validation score the same tokens with the same weights.
    rows = train(tmp_path / "run", overrides(data, f"data.val_path={data['train']}",
                                             "trainer.global_batch_size=8",
                                             "trainer.total_steps=1"))
    assert rows[0]["step"] == 0
    assert rows[0]["val/loss"] == pytest.approx(rows[1]["loss"], rel=1e-5)


def test_epoch_counts_samples_drawn_over_the_dataset(tmp_path: Path,
                                                     data: dict[str, Path]) -> None:
    rows = train(tmp_path / "run", overrides(data))
    assert [row["epoch"] for row in rows] == [3 / 8, 6 / 8, 1 + 1 / 8, 1 + 4 / 8]


@pytest.mark.slow
def test_two_ranks_share_the_held_out_set(tmp_path: Path, data: dict[str, Path]) -> None:
    options = overrides(data, f"data.val_path={data['val']}", "trainer.val_every_steps=1",
                        "trainer.total_steps=1", "trainer.global_batch_size=4")
    one = train(tmp_path / "one", options)
    two = run_graft_train(options, tmp_path / "two", nproc=2, timeout_s=400)
    # 5 held-out samples: 3 on rank 0, 2 on rank 1; the sums over both are the whole set's.
    assert [row["step"] for row in two] == [0, 1]
    assert two[0]["val/loss"] == pytest.approx(one[0]["val/loss"], rel=1e-5)
