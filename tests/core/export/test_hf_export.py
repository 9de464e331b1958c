"""Export to Hugging Face directories: every preset family, from training and from checkpoints."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from graft.checkpoint.reader import load_tensors
from graft.config import ModelConfig
from graft.models import build_model
from graft.testing.families import check_hf_export

PRESETS = ["tiny-llama", "tiny-qwen3-moe", "tiny-deepseek-v3"]  # plugins test their own


def trained_model(run_dir: Path, preset: str) -> torch.nn.Module:
    """The trainer's weights after the last step, in an unsharded model of the same preset."""
    model, _ = build_model(ModelConfig(preset=preset))
    missing, unexpected = model.load_state_dict(load_tensors(run_dir / "checkpoints" / "step_2"),
                                                strict=False)
    assert not missing and not unexpected
    return model.eval()


@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS)
def test_two_rank_training_exports_a_loadable_identical_model(run_graft, tmp_path: Path,
                                                              preset: str) -> None:
    result = run_graft(["train", "--nproc", "2", f"trainer.run_dir={tmp_path}", "trainer.mode=sft",
                        "trainer.total_steps=2", f"model.preset={preset}"])
    assert result.returncode == 0, result.stderr[-4000:]
    check_hf_export(tmp_path, preset, step=2)


@pytest.mark.slow
def test_graft_export_cli_converts_a_checkpoint(run_graft, tmp_path: Path) -> None:
    run = tmp_path / "run"
    result = run_graft(["train", f"trainer.run_dir={run}", "trainer.total_steps=2",
                        "trainer.mode=sft", "model.preset=tiny-deepseek-v3",
                        "export.hf_at_end=false"])
    assert result.returncode == 0, result.stderr[-3000:]
    out = tmp_path / "hf-bf16"
    converted = run_graft(["export", "--ckpt", str(run), "--out", str(out), "--dtype", "bf16"])
    assert converted.returncode == 0, converted.stderr[-3000:]
    model, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert model.config.dtype == torch.bfloat16
    assert (out / "tokenizer.json").is_file() and (out / "generation_config.json").is_file()
    reference = trained_model(run, "tiny-deepseek-v3").to(torch.bfloat16)
    for name, tensor in reference.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name


def test_export_of_a_missing_checkpoint_is_a_clear_error(run_graft, tmp_path: Path) -> None:
    result = run_graft(["export", "--ckpt", str(tmp_path / "nope"), "--out", str(tmp_path / "o")])
    assert result.returncode == 2 and "does not exist" in result.stderr


@pytest.mark.slow
def test_end_of_run_export_replaces_only_what_graft_wrote(run_graft, tmp_path: Path) -> None:
    """A foreign <run_dir>/hf is refused before training starts (training first and refusing the
    export after it would leave the weights unwritten with checkpoint.save_at_end=false)."""
    train = ["train", f"trainer.run_dir={tmp_path}", "trainer.mode=sft", "model.preset=tiny-llama",
             "trainer.total_steps=2"]
    notes = tmp_path / "hf" / "notes.txt"
    notes.parent.mkdir()
    notes.write_text("precious\n")
    refused = run_graft([*train, "checkpoint.save_at_end=false"])
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    assert "holds files Graft did not write (notes.txt" in refused.stderr
    assert "set export.hf_at_end=false" in refused.stderr
    assert notes.read_text() == "precious\n" and not (tmp_path / "checkpoints").exists()
    assert not (tmp_path / "metrics.jsonl").exists()  # nothing trained
    notes.unlink()  # an empty folder is fine: the run trains and exports into it
    exported = run_graft(train)
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert sorted(os.listdir(tmp_path / "hf")) == sorted(
        [".graft-export.json", "config.json", "generation_config.json", "model.safetensors",
         "tokenizer.json", "tokenizer_config.json"])
