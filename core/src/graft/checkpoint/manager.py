"""`CheckpointManager`: atomic DCP saves (optionally async), verified loads, exact resume.

A checkpoint folder holds the DCP shards and ``.metadata`` (model and flattened optimizer state),
``trainer.json`` (step, scheduler, data position), ``rng/rank_<r>.json`` (per-rank generator
states), ``config.yaml`` and ``manifest.json`` (size and SHA-256 of every file).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from contextlib import AbstractContextManager
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
from graft.checkpoint import layout
from graft.checkpoint.context import LoadContext
from graft.checkpoint.manifest import build_manifest, verify_files, write_manifest
from graft.checkpoint.reader import resolve_checkpoint
from graft.checkpoint.rng import capture_rng_state, restore_rng_state
from graft.checkpoint.safe_io import (
    SafeFileSystemReader,
    SafeLoadPlanner,
    dcp_failures,
    read_metadata,
)
from graft.engine.distributed import DistEnv, broadcast_object
from graft.errors import CheckpointError
from graft.plugins import get_plugin_manager

logger = logging.getLogger("graft.checkpoint")
OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


def _reported(action: str) -> AbstractContextManager[None]:
    """`dcp_failures` for this manager's saves and loads, which never move checkpoints/latest."""
    return dcp_failures(action, note="The checkpoint named by checkpoints/latest is untouched.")


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


class CheckpointManager:
    """Saves and loads the checkpoints of one run directory."""

    def __init__(self, run_dir: Path, cfg: Any, env: DistEnv) -> None:
        self.run_dir = run_dir
        self.cfg = cfg
        self.env = env
        self._pending: tuple[Any, Path, int] | None = None
        # Background saves coordinate over gloo, never over NCCL from a side thread.
        self._async_group = (dist.new_group(backend="gloo")
                             if cfg.async_save and env.device.type == "cuda" else None)

    def should_save(self, step: int, total_steps: int) -> bool:
        """Every ``every_steps`` steps and after the last one."""
        every = self.cfg.every_steps
        return (step == total_steps and self.cfg.save_at_end) or (every > 0 and step % every == 0)

    def save(self, step: int, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
             trainer_state: dict[str, Any], config_yaml: str) -> None:
        """Write a checkpoint of ``step``; published atomically once every rank's shards exist."""
        self.wait()
        tmp = self._make_tmp_dir(step)
        model_state, optim_state = get_state_dict(model, optimizer, options=OPTIONS)
        self._write_side_files(tmp, step, trainer_state, config_yaml)
        state = {"model": model_state, "optim": optim_state}
        writer = dcp.FileSystemWriter(str(tmp))
        with _reported(f"saving checkpoint step_{step} into {tmp}"):
            if self.cfg.async_save:
                future = dcp.async_save(state, storage_writer=writer,
                                        process_group=self._async_group)
                self._pending = (future, tmp, step)
            else:
                dcp.save(state, storage_writer=writer)
        if not self.cfg.async_save:
            self._publish(tmp, step)

    def wait(self) -> None:
        """Finish (and publish) an asynchronous save still in flight."""
        if self._pending is None:
            return
        future, tmp, step = self._pending
        self._pending = None
        with _reported(f"saving checkpoint step_{step} into {tmp}"):
            future.result()
        self._publish(tmp, step)

    def _make_tmp_dir(self, step: int) -> Path:
        name = broadcast_object(f"{layout.TMP_PREFIX}step_{step}-{uuid.uuid4().hex[:8]}")
        tmp = layout.checkpoints_dir(self.run_dir) / name
        if self.env.is_main:
            (tmp / "rng").mkdir(parents=True)
        _barrier()
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
        _barrier()
        entries = build_manifest(tmp, rank=self.env.rank, world=self.env.world_size)
        if self.env.is_main:
            write_manifest(tmp, entries)
            layout.publish(tmp, layout.step_dir(self.run_dir, step))
            layout.prune(self.run_dir, self.cfg.keep_last)
            logger.info("saved checkpoint %s", layout.step_dir(self.run_dir, step))
        _barrier()

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
        verify_files(path, checksums=True, rank=self.env.rank, world=self.env.world_size)
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
        with _reported(f"loading checkpoint {path}"):
            dcp.load(to_read, storage_reader=SafeFileSystemReader(str(path)),
                     planner=SafeLoadPlanner())
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
