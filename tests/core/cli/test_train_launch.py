"""``graft train`` before and around torchrun: errors that need no ranks are found before the
launch, a rank's error reaches the user once with its exit code, OpenMP's wait policy."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from graft.engine.distributed.launch import report_failed_ranks

SFT = ("trainer.mode=sft", "model.preset=tiny-llama")


@pytest.mark.parametrize(("args", "message"), [
    (["model.path=/nonexistent/dir"], "model.path '/nonexistent/dir' does not exist"),
    (["model.path={tmp}/empty"], "it has no config.json"),
    (["data.source=file", "data.path=/nonexistent/train.jsonl"],
     "dataset file '/nonexistent/train.jsonl' does not exist (data.path)"),
    (["data.source=file", "data.path={tmp}/empty"], "is a directory (data.path)"),
    (["data.source=file"], "data.source=file needs data.path"),
    (["data.tokenizer=/nonexistent/tok"], "data.tokenizer '/nonexistent/tok' does not exist"),
], ids=["model-missing", "model-without-config", "data-missing", "data-a-folder", "data-unset",
        "tokenizer-missing"])
def test_errors_that_need_no_ranks_are_found_before_the_launch(run_graft, tmp_path: Path,
                                                               args: list[str],
                                                               message: str) -> None:
    (tmp_path / "empty").mkdir()
    args = [arg.replace("{tmp}", str(tmp_path)) for arg in args]
    result = run_graft(["train", "--nproc", "2", f"trainer.run_dir={tmp_path / 'run'}", *SFT,
                        *args])
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.count("graft: error:") == 1 and message in result.stderr, result.stderr
    assert "launching" not in result.stderr, "found by the ranks, after torchrun started them"
    assert "Traceback" not in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("debug", [False, True])
def test_an_error_found_by_the_ranks_is_printed_once_with_their_exit_code(
        run_graft, tmp_path: Path, debug: bool) -> None:
    # Needs the data tokenized, so only the ranks can find it.
    result = run_graft(["train", "--nproc", "2", f"trainer.run_dir={tmp_path / 'run'}", *SFT,
                        "engine.max_tokens_per_micro_batch=8"],
                       env={"GRAFT_DEBUG": "1"} if debug else {})
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("graft: error:")]
    assert len(errors) == 1 and "more than the micro-batch token budget" in errors[0], \
        result.stderr[-3000:]
    # torchrun's report (and a rank's traceback) only when asked for
    assert ("ChildFailedError" in result.stderr) == debug, result.stderr[-3000:]
    assert ("Traceback" in result.stderr) == debug


def failure(tmp_path: Path, rank: int, exitcode: int) -> ProcessFailure:
    return ProcessFailure(local_rank=rank, pid=1000 + rank, exitcode=exitcode,
                          error_file=str(tmp_path / f"no_torchrun_error_file_{rank}"))


def record(folder: Path, rank: int, message: str, exit_code: int = 2) -> None:
    (folder / f"rank_{rank}.json").write_text(json.dumps({"message": message,
                                                          "exit_code": exit_code}))


def test_failed_ranks_report_one_error_and_its_exit_code(tmp_path: Path, capsys) -> None:
    record(tmp_path, 0, "bad data")
    record(tmp_path, 1, "bad data")
    failures = {0: failure(tmp_path, 0, 2), 1: failure(tmp_path, 1, 2)}
    assert report_failed_ranks(failures, tmp_path) == 2
    assert capsys.readouterr().err == "graft: error: bad data\n"
    record(tmp_path, 1, "rank 1's own data is bad too", exit_code=3)
    assert report_failed_ranks(failures, tmp_path) == 2
    assert capsys.readouterr().err.splitlines() == [
        "graft: error: bad data",
        "graft: rank 0's error; rank 1 failed with another (GRAFT_DEBUG=1 prints every rank's)"]


def test_a_rank_that_recorded_nothing_is_named_with_its_exit_code(tmp_path: Path,
                                                                  capsys) -> None:
    crashed, stopped = failure(tmp_path, 1, 1), failure(tmp_path, 0, -15)
    stopped.timestamp = crashed.timestamp + 1  # rank 1 failed, then torchrun stopped rank 0
    failures = {0: stopped, 1: crashed}
    assert report_failed_ranks(failures, tmp_path) == 1
    assert "rank 1 failed with exit code 1" in capsys.readouterr().err
    assert report_failed_ranks({0: failure(tmp_path, 0, -2)}, tmp_path) == 130
    assert capsys.readouterr().err == "", "Ctrl-C: rank 0 says what happened"


@pytest.mark.slow
@pytest.mark.parametrize(("env", "spin"), [({}, "100"), ({"GOMP_SPINCOUNT": "5000"}, "5000")])
def test_openmp_threads_spin_as_briefly_before_the_first_checkpoint_as_after_it(
        run_graft, tmp_path: Path, env: dict[str, str], spin: str) -> None:
    """libgomp spins 300,000 times per wait until a process has more OpenMP threads than cores,
    100 times after; a checkpoint save starts more (gloo's threads), so steps on busy cores
    were several times slower before the first save. `graft train` sets the short spin from
    the start, unless the user chose one."""
    result = run_graft(["train", f"trainer.run_dir={tmp_path / 'run'}", *SFT,
                        "trainer.total_steps=1", "export.hf_at_end=false"],
                       env={"OMP_DISPLAY_ENV": "verbose", **env})
    assert result.returncode == 0, result.stderr[-3000:]
    shown = re.findall(r"GOMP_SPINCOUNT = '(\d+)'", result.stderr)
    assert shown and set(shown) == {spin}, result.stderr[:3000]
