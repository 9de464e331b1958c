"""``graft plot`` (graft-plot, found through its entry point as a user's install finds it): PNGs
of a real run's curves from its metrics.jsonl, several runs compared, and clear errors for what
cannot be plotted or written."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import graft
from graft.output_dirs import MARKER
from graft_plot import curve_series, read_metrics

PNG = b"\x89PNG\r\n\x1a\n"
TINY = ("model.preset=tiny-llama", "engine.device=cpu", "export.hf_at_end=false",
        "checkpoint.save_at_end=false")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny RL run with validation (rl) and a tiny SFT run (sft), each of 3 steps."""
    root = tmp_path_factory.mktemp("plot-runs")
    held_out = root / "val.jsonl"
    held_out.write_text('{"prompt": "say ab:", "answer": "abababab"}\n')
    graft.train(graft.compose([f"trainer.run_dir={root / 'rl'}", *TINY, "trainer.total_steps=3",
                               "rollout.prompts_per_step=2", "rollout.n=2",
                               "rollout.max_new_tokens=4", f"data.val_path={held_out}",
                               "data.val_answer_key=answer", "trainer.val_every_steps=1"]))
    graft.train(graft.compose([f"trainer.run_dir={root / 'sft'}", *TINY, "trainer.mode=sft",
                               "trainer.total_steps=3"]))
    return {"rl": root / "rl", "sft": root / "sft"}


def pngs(folder: Path) -> list[str]:
    """The PNGs in ``folder``, each checked to be one."""
    names = sorted(p.name for p in folder.glob("*.png"))
    assert all((folder / name).read_bytes().startswith(PNG) for name in names)
    return names


def test_a_real_rl_run_gets_a_png_of_each_quantity(run_graft, runs: dict[str, Path]) -> None:
    result = run_graft(["plot", str(runs["rl"])])
    assert result.returncode == 0, result.stderr
    assert pngs(runs["rl"] / "plots") == [
        "entropy.png", "kl.png", "loss.png", "mismatch.png", "response_length.png",
        "reward.png", "throughput.png", "validation.png"]
    assert "skipped" not in result.stdout
    # a second plot replaces the folder it wrote
    assert run_graft(["plot", str(runs["rl"])]).returncode == 0
    assert json.loads((runs["rl"] / "plots" / MARKER).read_text())["written_by"] == "graft plot"


def test_runs_are_compared_and_what_no_run_logged_is_skipped(run_graft, runs: dict[str, Path],
                                                             tmp_path: Path) -> None:
    out = tmp_path / "compare"
    result = run_graft(["plot", str(runs["sft"]), str(runs["rl"]), "--out", str(out)])
    assert result.returncode == 0, result.stderr
    assert "reward.png" in pngs(out) and "validation.png" in pngs(out)
    histories = {name: read_metrics(path) for name, path in runs.items()}
    assert list(curve_series(histories, ("loss",))) == ["rl", "sft"]  # one line a run
    assert list(curve_series(histories, ("tokens_per_s", "rollout_tokens_per_s"))) == [
        "rl tokens_per_s", "rl rollout_tokens_per_s", "sft tokens_per_s"]
    # validation before the first step too
    assert curve_series(histories, ("val/reward_mean",))["rl"].steps == [0, 1, 2, 3]
    alone = run_graft(["plot", str(runs["sft"]), "--out", str(tmp_path / "sft")])
    assert "reward.png" not in pngs(tmp_path / "sft")
    assert "skipped, no run logged them: reward (reward_mean); validation" in alone.stdout


def test_what_cannot_be_plotted_is_a_clear_error(run_graft, runs: dict[str, Path],
                                                 tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    for args, message in [
        ([str(empty)], f"{empty} holds no metrics.jsonl: give the trainer.run_dir"),
        ([str(tmp_path / "nowhere")], "does not exist"),
        ([str(runs["rl"]), str(runs["sft"])], "graft plot of 2 runs needs --out DIR"),
        ([str(runs["rl"]), "--out", str(runs["rl"])], "is the run directory"),
    ]:
        result = run_graft(["plot", *args])
        assert result.returncode == 2 and message in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n{"step": 2,\n{"step": 3}\n')
    result = run_graft(["plot", str(broken)])
    assert result.returncode == 2 and f"{broken / 'metrics.jsonl'}:2 is not a JSON line" in result.stderr


def test_files_graft_did_not_write_are_never_replaced(run_graft, runs: dict[str, Path],
                                                      tmp_path: Path) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    result = run_graft(["plot", str(runs["sft"]), "--out", str(out)])
    assert result.returncode == 2 and "holds files Graft did not write (notes.txt" in result.stderr
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_a_run_being_written_is_plotted_without_its_last_partial_line(run_graft,
                                                                      tmp_path: Path) -> None:
    run = tmp_path / "live"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n{"st')
    assert run_graft(["plot", str(run)]).returncode == 0
    assert pngs(run / "plots") == ["loss.png"]


def test_without_matplotlib_the_pip_command_is_named(runs: dict[str, Path], tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from graft.cli.main import main

    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # `import` then fails
    assert main(["plot", str(runs["sft"]), "--out", str(tmp_path / "p")]) == 2
    assert "`pip install matplotlib`" in capsys.readouterr().err
    assert not (tmp_path / "p").exists()
