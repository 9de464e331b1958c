"""``graft ckpt inspect`` reports what is on disk and flags files that differ from the manifest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

STEP = Path("checkpoints") / "step_1"


@pytest.mark.slow
def test_inspect_reports_the_size_on_disk_and_flags_a_truncated_file(graft_cli,
                                                                      run_copy: Path) -> None:
    ckpt = run_copy / STEP
    shard = next(ckpt.glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:100])
    manifest = json.loads((ckpt / "manifest.json").read_text())["files"]
    on_disk = sum((ckpt / name).stat().st_size for name in manifest)
    result = graft_cli(["ckpt", "inspect", str(ckpt)])
    assert result.returncode == 2, result.stderr
    assert (f"size on disk    {on_disk / 2**20:.1f} MiB in {len(manifest)} files, 1 damaged"
            in result.stdout), result.stdout
    assert f"{shard} has 100 bytes, the checkpoint wrote" in result.stderr
    assert f"graft ckpt verify {ckpt}" in result.stderr
    as_json = graft_cli(["ckpt", "inspect", str(ckpt), "--json"])
    assert as_json.returncode == 2
    summary = json.loads(as_json.stdout)
    assert summary["size_bytes"] == on_disk
    assert [f"{shard} has 100 bytes" in line for line in summary["damaged_files"]] == [True]


def test_inspect_of_a_sound_checkpoint(graft_cli, tiny_run: Path) -> None:
    result = graft_cli(["ckpt", "inspect", str(tiny_run / STEP)])
    assert result.returncode == 0, result.stderr
    assert "damaged" not in result.stdout
    # every parameter of the run has optimizer state: nothing to say about it
    assert "optimizer state" not in result.stdout, result.stdout
    assert json.loads(graft_cli(["ckpt", "inspect", str(tiny_run / STEP), "--json"]).stdout)[
        "damaged_files"] == []


def test_inspect_names_the_tensors_without_optimizer_state(capsys) -> None:
    from graft.checkpoint.reader import CheckpointSummary
    from graft.cli.ckpt_cmd import print_summary

    summary = CheckpointSummary(path="run/checkpoints/step_3", step=3, world_size=2,
                                graft_version="0.1.0", saved_at="now", size_bytes=2**20,
                                num_files=1, parameter_count=10, num_tensors=4,
                                params_without_optimizer_state=["a.weight", "b.bias"])
    print_summary(summary, with_config=False)
    out = capsys.readouterr().out
    assert "size on disk    1.0 MiB in 1 file\n" in out
    assert "optimizer state missing for 2 of 4 tensors (a.weight, b.bias)\n" in out
