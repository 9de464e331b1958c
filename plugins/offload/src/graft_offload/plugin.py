"""The plugin's table of contents: every point where graft-offload touches Graft's core, in run
order. No torch here: Graft imports this module for every command."""

from __future__ import annotations

import sys
from typing import Any

from graft import hookimpl
from graft_offload.config import OffloadConfig


@hookimpl
def graft_config_sections() -> list[tuple[str, type]]:
    """``features.offload`` (`graft_offload.config.OffloadConfig`)."""
    return [("offload", OffloadConfig)]


@hookimpl
def graft_pre_shard(model: Any, cfg: Any, role: str) -> None:
    """Route the selected blocks of the policy model through an offloader (after activation
    checkpointing, before FSDP2; the model may still be on the meta device); the reference
    model is left alone."""
    if cfg.features.offload.enabled:
        from graft_offload.runtime import offload_from_config

        offload_from_config(model, cfg, role)


@hookimpl
def graft_step_begin(step: int) -> None:
    """Reset every offloader's state and counters."""
    runtime = _runtime_if_loaded()
    if runtime is not None:
        runtime.begin_step()


@hookimpl
def graft_step_end(step: int, metrics: dict[str, float]) -> None:
    """Add ``offload/host_gb``, ``offload/pinned_gb``, ``offload/offloaded_gb``,
    ``offload/other_saved_gb`` and ``offload/kept_on_gpu_blocks``."""
    runtime = _runtime_if_loaded()
    if runtime is not None:
        runtime.end_step(metrics)


def _runtime_if_loaded() -> Any:
    # Offloaders exist only once graft_pre_shard loaded the runtime: runs without the offload
    # never import it.
    return sys.modules.get("graft_offload.runtime")
