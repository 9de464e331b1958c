"""The Python API for library users: compose a config and train without the CLI."""

from __future__ import annotations

from pathlib import Path

import graft


def test_train_from_python(tmp_path: Path) -> None:
    cfg = graft.compose([f"trainer.run_dir={tmp_path}", "trainer.total_steps=3",
                         "model.preset=tiny-llama", "engine.device=cpu", "trainer.mode=sft"])
    history = graft.train(cfg)
    assert [row["step"] for row in history] == [1, 2, 3]
    assert (tmp_path / "metrics.jsonl").exists() and (tmp_path / "config.yaml").exists()


def test_pieces_are_importable_without_the_cli() -> None:
    assert callable(graft.build_model) and callable(graft.parallelize)
    assert graft.Trainer.__name__ == "Trainer"
