"""Resume through the CLI: exact with the same world size, resharded across world sizes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from graft.checkpoint.reader import load_tensors
from graft.config import ModelConfig
from graft.models import build_model

# RL (the default mode) on the tiny MoE, small rollouts: resuming must also restore sampling.
MOE = ("model.preset=tiny-qwen3-moe", "checkpoint.every_steps=3", "rollout.prompts_per_step=4",
       "rollout.n=4")
SFT = ("trainer.mode=sft", "model.preset=tiny-llama")


@pytest.fixture
def train(graft_train):
    """``graft train`` for ``steps`` steps."""
    return lambda run_dir, steps, *args, nproc=1: graft_train(
        run_dir, f"trainer.total_steps={steps}", *args, nproc=nproc)


@pytest.fixture
def losses(metrics_of):
    """Step -> loss of a run."""
    return lambda run_dir: {row["step"]: row["loss"] for row in metrics_of(run_dir)}


def weights(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    return load_tensors(run_dir / "checkpoints" / f"step_{step}")


@pytest.mark.slow
def test_two_rank_resume_is_bit_identical(train, losses, tmp_path: Path) -> None:
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train(straight, 6, *MOE, nproc=2)
    train(resumed, 3, *MOE, nproc=2)
    result = train(resumed, 6, *MOE, nproc=2)  # a fresh process resumes from step 3
    assert "resumed from" in result.stderr
    assert losses(straight) == losses(resumed)
    a, b = weights(straight, 6), weights(resumed, 6)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    optim_a = load_tensors(straight / "checkpoints" / "step_6", prefix="optim.state.")
    optim_b = load_tensors(resumed / "checkpoints" / "step_6", prefix="optim.state.")
    assert all(torch.equal(optim_a[k], optim_b[k]) for k in optim_a)


@pytest.mark.slow
@pytest.mark.parametrize(("first", "second"), [(2, 1), (1, 2)])
def test_resume_with_another_world_size_reshards(train, losses, tmp_path: Path, first: int,
                                                 second: int) -> None:
    reference, resharded = tmp_path / "reference", tmp_path / "resharded"
    train(reference, 5, *MOE, nproc=first)
    train(resharded, 3, *MOE, nproc=first)
    train(resharded, 5, *MOE, nproc=second)
    expected, got = losses(reference), losses(resharded)
    assert expected.keys() == got.keys() == {1, 2, 3, 4, 5}
    for step in (4, 5):
        assert got[step] == pytest.approx(expected[step], rel=1e-5)


@pytest.mark.slow
def test_changed_model_shape_is_a_clear_error(run_graft, train, tmp_path: Path) -> None:
    train(tmp_path, 3, *SFT)
    result = run_graft(["train", f"trainer.run_dir={tmp_path}", "trainer.total_steps=4", *SFT,
                        "+model.overrides.num_attention_heads=2"])
    assert result.returncode == 2
    assert re.search(r"parameter 'model\.layers\.0\.self_attn\.[kq]_proj\.weight' has shape "
                     r"\(\d+, 64\) there but \(64, 64\) in this model", result.stderr)
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_async_save_resumes_exactly(train, losses, tmp_path: Path) -> None:
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    args = (*SFT, "checkpoint.every_steps=2", "checkpoint.async_save=true")
    train(straight, 4, *args)
    train(resumed, 2, *args)
    train(resumed, 4, *args)
    assert losses(straight) == losses(resumed)


@pytest.mark.slow
def test_ckpt_inspect_and_verify(run_graft, train, tmp_path: Path) -> None:
    train(tmp_path, 2, *SFT)
    inspect = run_graft(["ckpt", "inspect", str(tmp_path), "--json"])
    summary = json.loads(inspect.stdout)
    assert (summary["step"], summary["world_size"]) == (2, 1)
    model, _ = build_model(ModelConfig(preset="tiny-llama"))
    assert summary["parameter_count"] == sum(p.numel() for p in model.parameters())
    assert summary["params_without_optimizer_state"] == []
    verify = run_graft(["ckpt", "verify", str(tmp_path / "checkpoints" / "step_2")])
    assert verify.returncode == 0 and verify.stdout.startswith("ok:")
    (tmp_path / "checkpoints" / "step_2" / "trainer.json").write_text("{}")
    broken = run_graft(["ckpt", "verify", str(tmp_path)])
    assert broken.returncode == 2 and "trainer.json has" in broken.stderr
