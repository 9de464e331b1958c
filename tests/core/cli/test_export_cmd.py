"""``graft export`` never deletes what Graft did not write, reports a damaged checkpoint by its
file, and writes files with the umask's mode; real runs, real exports, through the CLI."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest

STEP = Path("checkpoints") / "step_1"


def snapshot(folder: Path) -> dict[str, str]:
    """Relative path -> SHA-256 of every file under ``folder``."""
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def export(graft_cli, run: Path, out: str | Path, *extra: str, cwd: Path | None = None):
    return graft_cli(["export", "--ckpt", str(run / STEP), "--out", str(out), *extra], cwd=cwd)


def test_a_folder_with_files_graft_did_not_write_needs_force(graft_cli, tiny_run: Path,
                                                              tmp_path: Path) -> None:
    out = tmp_path / "d"
    out.mkdir()
    (out / "notes.txt").write_text("precious\n")
    refused = export(graft_cli, tiny_run, out)
    assert refused.returncode == 2, refused.stderr
    assert "holds files Graft did not write (notes.txt" in refused.stderr
    assert "pass --force" in refused.stderr
    assert (out / "notes.txt").read_text() == "precious\n"
    assert sorted(os.listdir(tmp_path)) == ["d"], "nothing left behind next to it"
    forced = export(graft_cli, tiny_run, out, "--force")
    assert forced.returncode == 0, forced.stderr
    assert not (out / "notes.txt").exists() and (out / "model.safetensors").is_file()


def test_graft_replaces_its_own_export_and_writes_into_an_empty_folder(graft_cli, run_copy: Path,
                                                                       tmp_path: Path) -> None:
    out = tmp_path / "empty"
    out.mkdir()
    assert export(graft_cli, run_copy, out).returncode == 0
    again = export(graft_cli, run_copy, out)
    assert again.returncode == 0, again.stderr
    over_the_trainers = export(graft_cli, run_copy, run_copy / "hf")
    assert over_the_trainers.returncode == 0, over_the_trainers.stderr
    (out / "README.md").write_text("my notes on this model\n")
    refused = export(graft_cli, run_copy, out)
    assert refused.returncode == 2 and "(README.md)" in refused.stderr, refused.stderr
    assert (out / "README.md").is_file()


# (--out, the working directory), both below the run directory; always with --force
NEVER = {
    "the run directory": ("{run}", None),
    "the checkpoints folder": ("{run}/checkpoints", None),
    "the checkpoint": ("{run}/checkpoints/step_1", None),
    "dot in the run directory": (".", "{run}"),
    "dot-slash in the checkpoints folder": ("./", "{run}/checkpoints"),
    "dot-dot from the export": ("..", "{run}/hf"),
    "an empty working directory": (".", "{empty}"),
    "a link to the run directory": ("{link}", None),
}


@pytest.mark.parametrize("case", NEVER)
def test_the_run_the_checkpoint_and_the_working_directory_are_never_replaced(
        graft_cli, run_copy: Path, tmp_path: Path, case: str) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "link").symlink_to(run_copy, target_is_directory=True)
    names = {"run": run_copy, "empty": tmp_path / "empty", "link": tmp_path / "link"}
    out, cwd = (None if text is None else text.format(**names) for text in NEVER[case])
    before = snapshot(tmp_path)
    result = export(graft_cli, run_copy, out, "--force", cwd=None if cwd is None else Path(cwd))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "--force does not allow this" in result.stderr
    assert snapshot(tmp_path) == before
    assert sorted(os.listdir(tmp_path)) == ["empty", "link", "run"]


def test_a_folder_holding_another_run_is_never_replaced(graft_cli, tiny_run: Path,
                                                        run_copy: Path) -> None:
    before = snapshot(run_copy)
    result = export(graft_cli, tiny_run, run_copy.parent, "--force")
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"holds a Graft checkpoint ({run_copy / STEP})" in result.stderr
    assert snapshot(run_copy) == before


def test_a_file_is_not_a_folder_to_export_to(graft_cli, tiny_run: Path, tmp_path: Path) -> None:
    weights = tmp_path / "model.bin"
    weights.write_bytes(b"not yours")
    for out, says in ((weights, "is a file, not a folder"), (weights / "hf", "a file, not a folder")):
        result = export(graft_cli, tiny_run, out, "--force")
        assert result.returncode == 2 and says in result.stderr, result.stderr
    assert weights.read_bytes() == b"not yours" and sorted(os.listdir(tmp_path)) == ["model.bin"]


def test_a_link_to_an_export_keeps_pointing_at_the_new_export(graft_cli, tiny_run: Path,
                                                              tmp_path: Path) -> None:
    real = tmp_path / "real"
    assert export(graft_cli, tiny_run, real).returncode == 0
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    (real / "model.safetensors").write_bytes(b"stale")  # so the new export can be told apart
    result = export(graft_cli, tiny_run, link)
    assert result.returncode == 0, result.stderr
    assert link.is_symlink() and link.resolve() == real.resolve()
    assert (real / "model.safetensors").read_bytes() != b"stale"
    assert sorted(os.listdir(tmp_path)) == ["link", "real"]


def test_a_truncated_checkpoint_is_named_with_what_to_do(graft_cli, run_copy: Path,
                                                         tmp_path: Path) -> None:
    shard = next((run_copy / STEP).glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:100])
    result = export(graft_cli, run_copy, tmp_path / "out")
    assert result.returncode == 2, result.stderr
    assert f"{shard} has 100 bytes" in result.stderr
    assert f"graft ckpt verify {run_copy / STEP}" in result.stderr
    assert "export another checkpoint" in result.stderr
    assert not (tmp_path / "out").exists()


def test_every_file_gets_the_umask_mode(graft_cli, umask: int, tiny_run: Path,
                                        tmp_path: Path) -> None:
    assert export(graft_cli, tiny_run, tmp_path / "out").returncode == 0
    expected = 0o666 & ~umask
    folders = [tmp_path / "out", tiny_run / "hf", tiny_run / "checkpoints"]
    modes = {str(p): oct(stat.S_IMODE(p.stat().st_mode))
             for folder in folders for p in folder.rglob("*") if p.is_file()}
    assert str(tmp_path / "out" / "model.safetensors") in modes
    assert {path: mode for path, mode in modes.items() if mode != oct(expected)} == {}
