"""Puts graft-offload's CPU stand-in for the device (`DeferredCopyBackend`) in place of its CUDA
backend for the whole process, before graft-offload's own ``graft_pre_shard`` applies the
offload (``tryfirst``): ``graft train ... features.offload.enabled=true`` then offloads on a
machine without a GPU, as the plugin's in-process tests do with ``use_copy_backend``."""

from __future__ import annotations

from contextlib import ExitStack

from graft import hookimpl

_SELECTED = ExitStack()  # held open for the life of the process
_selected = False


@hookimpl(tryfirst=True)
def graft_pre_shard(cfg):
    global _selected
    if cfg.features.offload.enabled and not _selected:
        from graft_offload.runtime import use_copy_backend
        from graft_offload.standin import DeferredCopyBackend

        _SELECTED.enter_context(use_copy_backend(DeferredCopyBackend))
        _selected = True
