"""Every natural way to name a checkpoint works: ``step_<N>``, ``checkpoints/latest``,
``checkpoints/`` and the run directory, for ``graft ckpt inspect|verify``, ``graft export --ckpt``
and ``checkpoint.resume``; anything else is an error listing those forms."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from graft.checkpoint.reader import resolve_checkpoint
from graft.errors import CheckpointError

SFT = ("trainer.mode=sft", "model.preset=tiny-llama")
# form -> (path below the run directory, the step it designates); latest is step_2
FORMS = {
    "step folder": ("checkpoints/step_1", 1),
    "latest marker": ("checkpoints/latest", 2),
    "checkpoints folder": ("checkpoints", 2),
    "run directory": (".", 2),
}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished two-step run with a checkpoint after each step."""
    run = tmp_path_factory.mktemp("ckpt-paths") / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRAFT_")}
    result = subprocess.run([sys.executable, "-m", "graft", "train", f"trainer.run_dir={run}",
                             *SFT, "trainer.total_steps=2", "checkpoint.every_steps=1"],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_2"
    return run


def form_path(run_dir: Path, form: str) -> tuple[Path, Path]:
    """(what the user types, the step folder it designates)."""
    below, step = FORMS[form]
    return run_dir / below if below != "." else run_dir, run_dir / "checkpoints" / f"step_{step}"


@pytest.mark.parametrize("form", FORMS)
def test_ckpt_inspect_accepts(run_graft, run_dir: Path, form: str) -> None:
    given, expected = form_path(run_dir, form)
    result = run_graft(["ckpt", "inspect", str(given), "--json"])
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert Path(summary["path"]) == expected
    assert summary["step"] == FORMS[form][1]


@pytest.mark.parametrize("form", FORMS)
def test_ckpt_verify_accepts(run_graft, run_dir: Path, form: str) -> None:
    given, expected = form_path(run_dir, form)
    result = run_graft(["ckpt", "verify", str(given)])
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"ok: {expected}:")


@pytest.mark.parametrize("form", FORMS)
def test_export_accepts(run_graft, run_dir: Path, form: str, tmp_path: Path) -> None:
    given, expected = form_path(run_dir, form)
    result = run_graft(["export", "--ckpt", str(given), "--out", str(tmp_path / "hf")])
    assert result.returncode == 0, result.stderr
    assert f"from {expected} to" in result.stdout
    assert (tmp_path / "hf" / "model.safetensors").is_file()


def test_relative_latest_from_inside_the_checkpoints_folder(run_graft, run_dir: Path) -> None:
    result = run_graft(["ckpt", "inspect", "latest", "--json"], cwd=run_dir / "checkpoints")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["step"] == 2
    assert (run_dir / "checkpoints" / summary["path"]).resolve() == \
        (run_dir / "checkpoints" / "step_2").resolve()


@pytest.mark.slow
def test_resume_from_the_latest_marker_of_another_run(graft_train, metrics_of, run_dir: Path,
                                                      tmp_path: Path) -> None:
    marker = run_dir / "checkpoints" / "latest"
    result = graft_train(tmp_path, *SFT, "trainer.total_steps=3", f"checkpoint.resume={marker}")
    assert f"resumed from {run_dir / 'checkpoints' / 'step_2'} (step 2" in result.stderr
    assert [row["step"] for row in metrics_of(tmp_path)] == [3]


@pytest.mark.parametrize(("make", "message"), [
    (lambda root: root / "missing", "does not exist"),
    (lambda root: root / "run" / "config.yaml", "is a file, not a checkpoint"),
    (lambda root: root / "run" / "hf", "is not a checkpoint"),
])
def test_other_paths_are_refused_naming_the_accepted_forms(run_dir: Path, make, message: str) -> None:
    with pytest.raises(CheckpointError) as caught:
        resolve_checkpoint(make(run_dir.parent))
    text = str(caught.value)
    assert message in text
    for form in ("checkpoints/step_<N>", "checkpoints/latest", "<run_dir>/checkpoints,",
                 "run directory"):
        assert form in text, text


def test_run_without_checkpoints_says_so(run_graft, tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("trainer:\n  total_steps: 2\n")
    result = run_graft(["ckpt", "verify", str(tmp_path)])
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "run directory without a checkpoints/ folder" in result.stderr
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(CheckpointError, match=r"checkpoints/latest does not exist.*no checkpoint"):
        resolve_checkpoint(tmp_path / "checkpoints")
