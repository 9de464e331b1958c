"""Checkpoints on a small real disk (a tmpfs): the free space and each checkpoint's size are
reported, a save that cannot fit is refused before it writes, a save that runs out of space says
so and leaves no partial folder, and pruning makes room first (issue 36, findings 12 and 24)."""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from torch.distributed.checkpoint.state_dict import get_state_dict

from graft.checkpoint import space
from graft.checkpoint.layout import read_latest
from graft.checkpoint.manager import OPTIONS
from graft.config import compose
from graft.errors import CheckpointError
from graft.training.trainer import Trainer


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """``mount(size)``: a fresh tmpfs of ``size`` (``4m``); skips where this process may not
    mount (it needs root)."""
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        folder = tmp_path / f"disk{len(mounted)}"
        folder.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                               str(folder)], capture_output=True, check=False)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
        mounted.append(folder)
        return folder

    yield mount
    for folder in mounted:
        subprocess.run(["umount", str(folder)], check=True)


def fill(disk: Path, leave: int) -> None:
    """Write a file that leaves about ``leave`` bytes free on ``disk``."""
    with (disk / "filler").open("ab") as handle:
        handle.write(b"\0" * max(0, shutil.disk_usage(disk).free - leave))


def tiny_trainer(run_dir: Path, *overrides: str) -> Trainer:
    return Trainer(compose([f"trainer.run_dir={run_dir}", "trainer.total_steps=4",
                            "model.preset=tiny-llama", "engine.device=cpu", "trainer.mode=sft",
                            "export.hf_at_end=false", *overrides]))


def needed_by_save(run: Trainer) -> int:
    """The bytes a save of ``run`` reserves: its tensors (model and optimizer), config.yaml and
    `space.OVERHEAD_BYTES` for the files around them."""
    model, optim = get_state_dict(run.engine.model, run.engine.optimizer, options=OPTIONS)
    return (space.state_bytes({"model": model, "optim": optim}) + space.OVERHEAD_BYTES
            + len(run.config_yaml.encode()))


def partial_folders(run_dir: Path) -> list[Path]:
    return list((run_dir / "checkpoints").glob(".tmp-*")) if (run_dir / "checkpoints").exists() \
        else []


def test_graft_train_refuses_a_checkpoint_the_disk_cannot_hold(small_disk, run_graft) -> None:
    """A real run on a 1 MB disk: the first save (about 2.4 MB) is refused before it writes."""
    run_dir = small_disk("1m") / "run"
    done = run_graft(["train", f"trainer.run_dir={run_dir}", "trainer.total_steps=2",
                      "model.preset=tiny-llama", "engine.device=cpu", "trainer.mode=sft",
                      "checkpoint.every_steps=1", "export.hf_at_end=false"], timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "unexpected pos" not in done.stderr
    assert f"not enough disk space for checkpoint step_1 in {run_dir / 'checkpoints'}" \
        in done.stderr
    assert "No checkpoint was published" in done.stderr and "untouched" not in done.stderr
    assert "checkpoint.keep_last" in done.stderr and "trainer.run_dir" in done.stderr
    assert not partial_folders(run_dir)


@pytest.mark.parametrize("earlier_checkpoint", [False, True])
def test_a_save_that_runs_out_of_space_says_so_and_leaves_nothing(small_disk, tmp_path: Path,
                                                                  earlier_checkpoint: bool) -> None:
    """The estimate leaves out the trainer state (a few bytes of data position, here 1.2 MB):
    the save passes the check, its side files take the room and DCP's shard write fails."""
    disk = small_disk("16m")
    run = tiny_trainer(disk / "run", "checkpoint.keep_last=0")
    run.train_step()
    if earlier_checkpoint:
        run.save_checkpoint()
    run.train_step()
    needed = needed_by_save(run)
    fill(disk, leave=needed + 100_000)
    bulky = {"scheduler": run.engine.scheduler.state_dict(), "job": {"order": "x" * 1_200_000}}
    with pytest.raises(CheckpointError) as caught:
        run.checkpoints.save(2, model=run.engine.model, optimizer=run.engine.optimizer,
                             trainer_state=bulky, config_yaml=run.config_yaml)
    message = str(caught.value)
    assert f"saving checkpoint step_2 in {disk / 'run' / 'checkpoints'} failed: no space left " \
           f"on device" in message
    assert "unexpected pos" not in message and "free there" in message
    assert not partial_folders(disk / "run")
    if earlier_checkpoint:
        assert f"The last checkpoint, {disk / 'run' / 'checkpoints' / 'step_1'}" in message
        assert read_latest(disk / "run").name == "step_1"
    else:
        assert "No checkpoint was published" in message and "untouched" not in message
        assert read_latest(disk / "run") is None


def test_pruning_makes_room_before_the_save(small_disk, caplog) -> None:
    """keep_last=2 with step_1 and step_2 saved: step_3 fits only without step_1, which pruning
    removes after the save anyway; it goes first. With keep_last=0 the save is refused."""
    caplog.set_level(logging.INFO, logger="graft.checkpoint")
    disk = small_disk("16m")
    run = tiny_trainer(disk / "run", "checkpoint.keep_last=2")
    for _ in range(2):
        run.train_step()
        run.save_checkpoint()
    checkpoints = disk / "run" / "checkpoints"
    step_1 = space.folder_bytes(checkpoints / "step_1")
    assert f"checkpoint step_2 takes {space.human(step_1)}" in caplog.text  # sizes are equal
    assert "saving checkpoint step_2 (about" in caplog.text and f"free in {checkpoints})" \
        in caplog.text
    run.train_step()
    fill(disk, leave=needed_by_save(run) - step_1 // 2)
    run.checkpoints.cfg.keep_last = 0  # every checkpoint is kept: nothing may go
    with pytest.raises(CheckpointError, match=r"not enough disk space for checkpoint step_3 .*"
                                              r"it needs about .* are free; nothing was written"):
        run.save_checkpoint()
    assert sorted(p.name for p in checkpoints.iterdir()) == ["latest", "step_1", "step_2"]
    run.checkpoints.cfg.keep_last = 2
    run.save_checkpoint()
    assert sorted(p.name for p in checkpoints.iterdir()) == ["latest", "step_2", "step_3"]
    assert f"removing {checkpoints / 'step_1'} now rather than after the save" in caplog.text
