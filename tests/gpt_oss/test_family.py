"""graft-gpt-oss's family: conformance of the preset, plugin conformance, a 2-rank export."""

from __future__ import annotations

from pathlib import Path

from graft.testing import check_installed_plugin
from graft.testing.families import check_family_preset, check_hf_export


def test_the_installed_plugin_passes_graft_testing() -> None:
    assert "graft_model_families" in check_installed_plugin("gpt_oss")


def test_tiny_preset_passes_the_family_conformance_check() -> None:
    check_family_preset("tiny-gpt-oss", num_routers=2)


def test_two_rank_training_exports_a_loadable_identical_model(run_graft, tmp_path: Path) -> None:
    result = run_graft(["train", "--nproc", "2", f"trainer.run_dir={tmp_path}", "trainer.mode=sft",
                        "trainer.total_steps=2", "model.preset=tiny-gpt-oss"])
    assert result.returncode == 0, result.stderr[-4000:]
    check_hf_export(tmp_path, "tiny-gpt-oss", step=2)
