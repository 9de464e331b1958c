"""Applying the offload to a model, and the process's live offloaders that the step hooks drive.

`offload_from_config` is what ``graft_pre_shard`` runs; `apply_offload` is the same for a
hand-built model (the benchmarks use it). `use_copy_backend` puts another copy backend (the CPU
stand-in in tests) in place of CUDA for the offloads applied inside the block.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from graft.errors import ConfigError
from graft.models import family_for
from graft_offload.backend import CopyBackend, CudaCopyBackend
from graft_offload.config import OffloadConfig
from graft_offload.offloader import Offloader
from graft_offload.patching import route_calls, unroute_calls
from graft_offload.patterns import select_modules
from graft_offload.pool import HostBufferPool

logger = logging.getLogger("graft.offload")

_LIVE: weakref.WeakSet[Offloader] = weakref.WeakSet()
_backend_factory: Callable[[], CopyBackend] = CudaCopyBackend
_DEFAULTS = OffloadConfig()


@contextmanager
def use_copy_backend(factory: Callable[[], CopyBackend]) -> Iterator[None]:
    """Offloads applied inside the block use ``factory()`` instead of `CudaCopyBackend`."""
    global _backend_factory
    previous, _backend_factory = _backend_factory, factory
    try:
        yield
    finally:
        _backend_factory = previous


def offload_from_config(model: torch.nn.Module, cfg: Any, role: str) -> Offloader | None:
    """Apply ``cfg.features.offload`` to ``model`` (the ``graft_pre_shard`` hook's work).

    Nothing happens when the section is off or for the frozen reference (``role`` other than
    ``policy``). The model may be on the meta device (a ``model.path`` checkpoint is built on
    meta, sharded, then filled): the offloader takes its device from the first block input it
    sees, and if that is not the copy backend's device it says so once and does nothing.
    `ConfigError` for patterns that match nothing and for activation checkpointing turned off.
    """
    section: OffloadConfig = cfg.features.offload
    if not section.enabled or role != "policy":
        return None
    family = family_for(getattr(getattr(model, "config", None), "model_type", ""))
    selected = select_modules(model, section.modules, family.decoder_blocks)
    if not cfg.engine.activation_checkpointing:
        raise ConfigError(
            "features.offload.enabled=true needs engine.activation_checkpointing=true: the "
            "offload moves the block inputs that checkpointing keeps; without checkpointing "
            "every intermediate activation stays on the GPU and the offload frees almost "
            "nothing. Set engine.activation_checkpointing=true (or features.offload.enabled=false).")
    return apply_offload(selected, backend=_backend_factory(),
                         host_cache_limit_bytes=section.host_cache_limit_bytes,
                         min_tensor_bytes=section.min_tensor_bytes,
                         prefetch_blocks=section.prefetch_blocks, timing=section.timing)


def apply_offload(modules: Sequence[tuple[str, torch.nn.Module]], *,
                  device: torch.device | None = None, backend: CopyBackend | None = None,
                  host_cache_limit_bytes: int = _DEFAULTS.host_cache_limit_bytes,
                  min_tensor_bytes: int = _DEFAULTS.min_tensor_bytes,
                  prefetch_blocks: int = _DEFAULTS.prefetch_blocks,
                  timing: bool = _DEFAULTS.timing) -> Offloader:
    """Offload the inputs of ``modules`` (``(name, module)`` in forward order) to host memory,
    with the settings of ``features.offload`` in bytes (its defaults unless given). ``device``:
    the device the blocks run on; None takes it from the first block input (a model on the
    meta device). A model whose first block input is not on the copy backend's device is
    left as it is (said once).

    Call it after activation checkpointing and before sharding. The step hooks drive the
    returned `Offloader` (`begin_step`, `end_step`); `remove_offload` undoes it.
    """
    backend = backend or _backend_factory()
    pool = HostBufferPool(host_cache_limit_bytes, backend)
    offloader = Offloader([name for name, _ in modules], backend=backend, device=device,
                          pool=pool, min_bytes=min_tensor_bytes,
                          prefetch_blocks=prefetch_blocks, timing=timing)
    route_calls([module for _, module in modules], offloader)
    _LIVE.add(offloader)
    logger.info("graft-offload: offloading the inputs of %d modules (%s .. %s) to at most "
                "%.1f GiB of host memory", len(modules), modules[0][0], modules[-1][0],
                host_cache_limit_bytes / 2**30)
    return offloader


def remove_offload(modules: Sequence[torch.nn.Module], offloader: Offloader) -> None:
    """Undo `apply_offload` on ``modules`` (before sharding) and free the idle host buffers."""
    unroute_calls(modules)
    offloader.reset()
    offloader.pool.close()
    _LIVE.discard(offloader)


def begin_step() -> None:
    """Reset every live offloader (``graft_step_begin``)."""
    for offloader in list(_LIVE):
        offloader.begin_step()


def end_step(metrics: dict[str, float]) -> None:
    """Add to ``metrics`` the metrics of the offloaders whose model ran a pass with gradients
    this step, summed (``graft_step_end``); an offloader of a model no longer trained (another
    run in the same process) adds nothing."""
    for offloader in list(_LIVE):
        if offloader.stats.passes:
            for name, value in offloader.end_step().items():
                metrics[name] = metrics.get(name, 0.0) + value

