"""`CheckpointManager`: atomic DCP saves (optionally async), verified loads, exact resume.

A checkpoint folder holds the DCP shards and ``.metadata`` (model and flattened optimizer state),
``trainer.json`` (step, scheduler, data position), ``rng/rank_<r>.json`` (per-rank generator
states), ``config.yaml`` and ``manifest.json`` (size and SHA-256 of every file).
"""

from __future__ import annotations

import json
import logging
import shutil
import time
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)

from graft._version import __version__
from graft.checkpoint import LoadContext, layout, space
from graft.checkpoint.manifest import build_manifest, verify_files, write_manifest
from graft.checkpoint.reader import resolve_checkpoint
from graft.checkpoint.rng import capture_rng_state, restore_rng_state
from graft.checkpoint.safe_io import (
    SafeFileSystemReader,
    SafeLoadPlanner,
    dcp_failures,
    read_metadata,
)
from graft.engine.distributed.env import DistEnv, broadcast_object
from graft.errors import CheckpointError
from graft.plugins import get_plugin_manager

logger = logging.getLogger("graft.checkpoint")
OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


def _reported(action: str, run_dir: Path) -> AbstractContextManager[None]:
    """`dcp_failures` for this manager's saves and loads, which never move checkpoints/latest."""
    return dcp_failures(action, note=untouched_note(run_dir))


def untouched_note(run_dir: Path) -> str:
    """What a failed save or load left of the run's checkpoints (read now: saves move
    checkpoints/latest only once they are complete)."""
    latest = layout.read_latest(run_dir)
    if latest is None:
        return "No checkpoint was published: this run has none to resume from yet."
    return f"The last checkpoint, {latest} (named by checkpoints/latest), is untouched."


ADVICE = ("free disk space, keep fewer checkpoints (checkpoint.keep_last), or set "
          "trainer.run_dir to a folder on a larger disk")


def _barrier(group: dist.ProcessGroup | None = None) -> None:
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.barrier(group=group)


def _gloo_group(env: DistEnv) -> dist.ProcessGroup:
    """A gloo group of the ranks that checkpoint (every rank, or the trainers' role, which
    creates it alone)."""
    if env.role_ranks is None:
        return dist.new_group(backend="gloo")
    return dist.new_group(ranks=list(env.role_ranks), backend="gloo",
                          use_local_synchronization=True)


class CheckpointManager:
    """Saves and loads the checkpoints of one run directory."""

    def __init__(self, run_dir: Path, cfg: Any, env: DistEnv) -> None:
        self.run_dir = run_dir
        self.cfg = cfg
        self.env = env
        self._pending: tuple[Any, Path, int, int] | None = None  # future, folder, step, bytes
        # Background saves coordinate over gloo, never over NCCL from a side thread.
        self._async_group = (_gloo_group(env)
                             if cfg.async_save and env.device.type == "cuda" else None)

    def should_save(self, step: int, total_steps: int) -> bool:
        """Every ``every_steps`` steps and after the last one."""
        every = self.cfg.every_steps
        return (step == total_steps and self.cfg.save_at_end) or (every > 0 and step % every == 0)

    def save(self, step: int, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
             trainer_state: dict[str, Any], config_yaml: str) -> None:
        """Write a checkpoint of ``step`` (what ``graft_ckpt_save`` plugins leave of the model's
        and optimizer's entries); published atomically once every rank's shards exist.

        Refused before anything is written (`CheckpointError`) when the disk cannot hold it even
        after the pruning ``keep_last`` does; a save that fails leaves no partial folder."""
        self.wait()
        model_state, optim_state = get_state_dict(model, optimizer, options=OPTIONS)
        state = {"model": model_state, "optim": optim_state}
        get_plugin_manager().hook.graft_ckpt_save(state=state, model=model, optimizer=optimizer)
        needed = space.state_bytes(state) + space.OVERHEAD_BYTES + len(config_yaml.encode())
        self._make_room(step, needed)
        tmp = self._make_tmp_dir(step)
        with self._save_failures(step, tmp, needed):
            self._write_side_files(tmp, step, trainer_state, config_yaml)
            writer = dcp.FileSystemWriter(str(tmp))
            if self.cfg.async_save:
                future = dcp.async_save(state, storage_writer=writer,
                                        process_group=self._async_group)
                self._pending = (future, tmp, step, needed)
            else:
                dcp.save(state, storage_writer=writer, process_group=self.env.group)
                self._publish(tmp, step)

    def wait(self) -> None:
        """Finish (and publish) an asynchronous save still in flight."""
        if self._pending is None:
            return
        future, tmp, step, needed = self._pending
        self._pending = None
        with self._save_failures(step, tmp, needed):
            future.result()
            self._publish(tmp, step)

    def _make_room(self, step: int, needed: int) -> None:
        """Rank 0 checks that ``needed`` bytes fit next to the run's checkpoints, removing
        early what pruning would remove after the save when that makes them fit; every rank
        raises the same `CheckpointError` when they cannot."""
        problem = self._room_problem(step, needed) if self.env.is_main else None
        problem = broadcast_object(problem, group=self.env.group)
        if problem is not None:
            raise CheckpointError(problem)

    def _room_problem(self, step: int, needed: int) -> str | None:
        root = layout.checkpoints_dir(self.run_dir)
        free = space.free_bytes(root)
        logger.info("saving checkpoint step_%d (about %s; %s free in %s)", step,
                    space.human(needed), space.human(free), root)
        if free >= needed:
            return None
        removable = layout.removable_before_save(self.run_dir, step, self.cfg.keep_last)
        reclaim = sum(space.folder_bytes(path) for path in removable)
        if free + reclaim < needed:
            freed = (f", {space.human(reclaim)} more once pruning (checkpoint.keep_last="
                     f"{self.cfg.keep_last}) removes {', '.join(p.name for p in removable)}"
                     if removable else "")
            return (f"not enough disk space for checkpoint step_{step} in {root}: it needs about "
                    f"{space.human(needed)}, {space.human(free)} are free{freed}; nothing was "
                    f"written. {untouched_note(self.run_dir)} To go on, {ADVICE}")
        for path in removable:
            logger.info("removing %s now rather than after the save, to make room "
                        "(checkpoint.keep_last=%d)", path, self.cfg.keep_last)
            shutil.rmtree(path, ignore_errors=True)
        return None

    @contextmanager
    def _save_failures(self, step: int, tmp: Path, needed: int) -> Iterator[None]:
        """Around writing and publishing ``tmp``: on failure the partial folder is removed and
        a full disk is reported as one, with the free space (DCP says ``unexpected pos``)."""
        root = layout.checkpoints_dir(self.run_dir)
        action = f"saving checkpoint step_{step} in {root}"
        try:
            with _reported(action, self.run_dir):
                yield
        except BaseException as exc:
            full = isinstance(exc, CheckpointError) and space.ran_out_of_space(exc, tmp)
            if self.env.is_main:
                shutil.rmtree(tmp, ignore_errors=True)
            if not full:
                raise
            raise CheckpointError(
                f"{action} failed: no space left on device ({space.human(space.free_bytes(root))}"
                f" free there without the partial checkpoint, which was removed; the checkpoint "
                f"needs about {space.human(needed)}). {untouched_note(self.run_dir)} To go on, "
                f"{ADVICE}") from exc

    def _make_tmp_dir(self, step: int) -> Path:
        name = broadcast_object(f"{layout.TMP_PREFIX}step_{step}-{uuid.uuid4().hex[:8]}",
                                group=self.env.group)
        tmp = layout.checkpoints_dir(self.run_dir) / name
        if self.env.is_main:
            (tmp / "rng").mkdir(parents=True)
        _barrier(self.env.group)
        return tmp

    def _write_side_files(self, tmp: Path, step: int, trainer_state: dict[str, Any],
                          config_yaml: str) -> None:
        rank_file = tmp / "rng" / f"rank_{self.env.rank}.json"
        rank_file.write_text(json.dumps(capture_rng_state()))
        if self.env.is_main:
            meta = {"step": step, "world_size": self.env.world_size, "graft_version": __version__,
                    "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S"), **trainer_state}
            (tmp / "trainer.json").write_text(json.dumps(meta, indent=1))
            (tmp / "config.yaml").write_text(config_yaml)

    def _publish(self, tmp: Path, step: int) -> None:
        _barrier(self.env.group)
        entries = build_manifest(tmp, rank=self.env.rank, world=self.env.world_size,
                                 group=self.env.group)
        if self.env.is_main:
            write_manifest(tmp, entries)
            final = layout.step_dir(self.run_dir, step)
            layout.publish(tmp, final)
            layout.prune(self.run_dir, self.cfg.keep_last)
            logger.info("checkpoint step_%d takes %s; %s left free in %s", step,
                        space.human(space.folder_bytes(final)),
                        space.human(space.free_bytes(final)), final.parent)
            logger.info("saved checkpoint %s", final)
        _barrier(self.env.group)

    def resume_path(self) -> Path | None:
        """The checkpoint ``checkpoint.resume`` selects: latest (auto), none (never), or a path."""
        resume = self.cfg.resume
        if resume == "never":
            return None
        if resume == "auto":
            return layout.read_latest(self.run_dir)
        try:
            return resolve_checkpoint(resume)
        except CheckpointError as exc:
            raise CheckpointError(f"checkpoint.resume={resume!r}: {exc} (or auto / never)") from exc

    def load(self, path: Path, *, model: torch.nn.Module,
             optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """Verify, let plugins map the checkpoint (``graft_ckpt_load``), check, read, load.

        The hook sees the live entries before anything is read, so a renamed entry is read
        from the checkpoint's key and checked there. Returns ``trainer.json`` (step, scheduler,
        data position) and restores this rank's random-number generators.
        """
        verify_files(path, checksums=True, rank=self.env.rank, world=self.env.world_size,
                     group=self.env.group)
        metadata = read_metadata(path).state_dict_metadata
        trainer = json.loads((path / "trainer.json").read_text())
        model_state, optim_state = get_state_dict(model, optimizer, options=OPTIONS)
        state = {"model": model_state, "optim": optim_state}
        live_keys = {id(v): (section, k) for section, entries in state.items()
                     for k, v in entries.items() if isinstance(v, torch.Tensor)}
        ctx = LoadContext(path, trainer["step"], trainer["world_size"], frozenset(metadata))
        get_plugin_manager().hook.graft_ckpt_load(state=state, model=model, optimizer=optimizer,
                                                  ctx=ctx)
        check_compatible(path, metadata, state, keep_fresh=ctx.keep_fresh)
        to_read = {section: {k: v for k, v in entries.items()
                             if f"{section}.{k}" not in ctx.keep_fresh}
                   for section, entries in state.items()}
        with _reported(f"loading checkpoint {path}", self.run_dir):
            dcp.load(to_read, storage_reader=SafeFileSystemReader(str(path)),
                     planner=SafeLoadPlanner(), process_group=self.env.group)
        for section, entries in to_read.items():
            state[section].update(entries)  # values DCP replaced rather than filled in place
        loaded = {section: {live_keys.get(id(v), (section, k))[1]: v for k, v in entries.items()}
                  for section, entries in state.items()}
        set_state_dict(model, optimizer, model_state_dict=loaded["model"],
                       optim_state_dict=loaded["optim"], options=OPTIONS)
        restore_rng_state(self._rng_state(path))
        logger.info("resumed from %s (step %d, saved by %d ranks)", path, trainer["step"],
                    trainer["world_size"])
        return trainer

    def _rng_state(self, path: Path) -> dict[str, Any]:
        own = path / "rng" / f"rank_{self.env.rank}.json"
        # With more ranks than the checkpoint had, new ranks continue from rank 0's generators.
        return json.loads((own if own.is_file() else path / "rng" / "rank_0.json").read_text())


def check_compatible(path: Path, saved: dict[str, Any], state: dict[str, dict[str, Any]], *,
                     keep_fresh: set[str] | frozenset[str] = frozenset()) -> None:
    """Every entry to read (all but ``keep_fresh``) must exist in the checkpoint with the same
    global shape, and every model tensor of the checkpoint must have a place in ``state``."""
    for section, entries in state.items():
        for name, value in entries.items():
            key = f"{section}.{name}"
            if key in keep_fresh:
                continue
            entry = saved.get(key)
            what = "parameter" if section == "model" else "optimizer entry"
            if entry is None:
                raise CheckpointError(f"checkpoint {path} has no {what} {name!r}: the model config "
                                      f"differs from the one it was saved with "
                                      f"({path / 'config.yaml'})")
            shape = getattr(value, "shape", None)
            if hasattr(entry, "size") and shape is not None and tuple(entry.size) != tuple(shape):
                raise CheckpointError(f"checkpoint {path}: {what} {name!r} has shape "
                                      f"{tuple(entry.size)} there but {tuple(shape)} in this "
                                      f"model; the model config differs ({path / 'config.yaml'})")
    extra = sorted(k[len("model."):] for k in saved
                   if k.startswith("model.") and k[len("model."):] not in state["model"])
    if extra:
        raise CheckpointError(f"checkpoint {path} has parameters this model lacks: "
                              f"{', '.join(extra[:5])}; the model config differs")
