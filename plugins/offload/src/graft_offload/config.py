"""The ``features.offload`` config section and its validation (no torch: imported by every command)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from graft.config import bounded

GIB = 2**30
MIB = 2**20

WILDCARD_CHILDREN = "{*}"


@dataclass
class OffloadConfig:
    """``features.offload``: offload the inputs activation checkpointing keeps to host memory."""

    # Offload the trained (policy) model's block inputs during forward + backward passes.
    enabled: bool = False
    # Modules whose inputs are offloaded, in forward order. `prefix.{*}`: every child of the
    # container at `prefix`, in order; other patterns match module names one dot-segment at a
    # time (`model.layers.*` matches model.layers.3, not model.layers.3.mlp). Empty: the model
    # family's decoder blocks.
    modules: list[str] = field(default_factory=list)
    # Hard ceiling on the host memory the plugin holds, pinned or not, in GiB (2^30 bytes); the
    # plugin pins its own memory, so this bounds what the process holds pinned for it. Block
    # inputs that do not fit stay on the GPU (reported). 0 keeps everything on the GPU.
    host_cache_limit_gb: float = bounded(32.0, ge=0, le=sys.maxsize // GIB,
                                         note="0 keeps every input on the GPU")
    # Inputs smaller than this (MiB) stay on the GPU: their copy costs more than it frees.
    min_tensor_mb: float = bounded(1.0, ge=0, le=sys.maxsize // MIB, note="0 offloads any size")
    # How many blocks below the one in backward are copied back ahead of time.
    prefetch_blocks: int = bounded(1, ge=1, note="1: bring back the next block down during "
                                                 "backward")
    # Time every copy and every wait of the compute stream with CUDA events; adds the metrics
    # offload/d2h_gbps, offload/h2d_gbps, offload/exposed_copy_ms, offload/d2h_ms_per_block and
    # offload/forward_ms_per_block (copies are bandwidth-bound when the first exceeds the second).
    timing: bool = False

    def __post_init__(self) -> None:
        # The numbers' ranges are checked when the config is composed (`graft.config.bounded`).
        for pattern in self.modules:
            check_pattern(pattern)

    @property
    def host_cache_limit_bytes(self) -> int:
        """`host_cache_limit_gb` in bytes."""
        return int(self.host_cache_limit_gb * GIB)

    @property
    def min_tensor_bytes(self) -> int:
        """`min_tensor_mb` in bytes."""
        return int(self.min_tensor_mb * MIB)


def check_pattern(pattern: object) -> None:
    """ValueError for a module pattern that cannot match anything by its form alone."""
    if not isinstance(pattern, str) or not pattern.strip():
        raise ValueError(f"features.offload.modules has the entry {pattern!r}; give dotted module "
                         f"names or patterns such as 'model.layers.{{*}}' or 'model.layers.*'")
    if pattern != pattern.strip() or " " in pattern:
        raise ValueError(f"features.offload.modules entry {pattern!r} contains spaces")
    segments = pattern.split(".")
    if "" in segments:
        raise ValueError(f"features.offload.modules entry {pattern!r} has an empty segment "
                         f"(two dots in a row, or a leading/trailing dot)")
    if WILDCARD_CHILDREN in pattern and (segments[-1] != WILDCARD_CHILDREN or len(segments) < 2
                                         or WILDCARD_CHILDREN in segments[:-1]):
        raise ValueError(f"features.offload.modules entry {pattern!r}: '{{*}}' is allowed only as "
                         f"the last segment after a container's name, as in 'model.layers.{{*}}'")
