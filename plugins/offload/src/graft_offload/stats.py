"""What one step of offload did: bytes moved, blocks kept on the device and why, copy timings."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from graft_offload.config import GIB
from graft_offload.transfers import D2H, H2D, CopyTimes

# Why a selected block's input stayed on the device.
LAST_BLOCK = "the last block (its backward runs first)"
HOST_FULL = "host_cache_limit_gb reached"
KEYWORD_INPUT = "input passed as a keyword argument"


@dataclass
class StepStats:
    """Counters of one training step (reset by `graft_step_begin`)."""

    passes: int = 0  # forward passes with gradients through the selected blocks
    offloaded_bytes: int = 0  # device -> host
    fetched_bytes: int = 0  # host -> device
    offloaded_inputs: int = 0  # block inputs copied to the host, over every pass of the step
    kept: dict[int, str] = field(default_factory=dict)  # block index -> why it stayed
    kept_bytes: int = 0  # of the block inputs that stayed on the device, but the last block's
    # Tensors other than their inputs and parameters that the selected blocks saved for
    # backward, by storage (a tensor saved by several blocks, as RoPE tables are, counts once):
    # with activation checkpointing in effect there are few and they are small.
    other_saved: dict[int, int] = field(default_factory=dict)

    def keep(self, block: int, reason: str, nbytes: int = 0) -> None:
        """Record that ``block``'s input (``nbytes`` bytes) stayed on the device (the first
        reason wins)."""
        self.kept.setdefault(block, reason)
        if reason != LAST_BLOCK:
            self.kept_bytes += nbytes

    def note_other_saved(self, tensor: Any) -> None:
        """Count a tensor a block saved that is neither its input nor a parameter (by the
        storage it keeps alive)."""
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):  # a tensor subclass without one storage
            return
        self.other_saved[storage.data_ptr()] = storage.nbytes()

    def kept_blocks(self, last_block: int) -> dict[int, str]:
        """The kept blocks other than the last one (``last_block``, kept by design)."""
        return {block: why for block, why in self.kept.items() if block != last_block}


def copy_rates(times: CopyTimes, elapsed_ms: Callable[[Any, Any], float]) -> dict[str, float]:
    """What the timing events say: achieved copy rates per direction (GB/s, 10^9 bytes), the
    compute stream's time spent waiting for copies (ms: the copy time not hidden behind
    compute), and the median time of one block input's copy out against the median time
    between two consecutive copies out (one block's forward): copies are bandwidth-bound when
    the first is longer."""
    busy = {D2H: 0.0, H2D: 0.0}
    moved = {D2H: 0, H2D: 0}
    d2h_ms = []
    for direction, nbytes, start, end in times.copies:
        duration = elapsed_ms(start, end)
        busy[direction] += duration
        moved[direction] += nbytes
        if direction == D2H:
            d2h_ms.append(duration)
    starts = times.block_starts
    between = [elapsed_ms(a, b) for a, b in zip(starts, starts[1:], strict=False)]
    return {"offload/d2h_gbps": moved[D2H] / 1e6 / busy[D2H] if busy[D2H] else 0.0,
            "offload/h2d_gbps": moved[H2D] / 1e6 / busy[H2D] if busy[H2D] else 0.0,
            "offload/exposed_copy_ms": sum(elapsed_ms(a, b) for a, b in times.waits),
            "offload/d2h_ms_per_block": median(d2h_ms),
            "offload/forward_ms_per_block": median(between)}


def median(values: list[float]) -> float:
    """The median (0 for no values)."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def step_metrics(stats: StepStats, host_bytes: int, pinned_bytes: int,
                 last_block: int) -> dict[str, float]:
    """The per-step metrics: host memory held (GiB) and the part of it that is page-locked
    (GiB), bytes offloaded this step (GiB) and the number of block inputs they were, the bytes
    the blocks saved besides their inputs and parameters (GiB), how many selected blocks other
    than the last (``last_block``) kept their input on the GPU and those inputs' bytes (GiB)."""
    return {"offload/host_gb": host_bytes / GIB, "offload/pinned_gb": pinned_bytes / GIB,
            "offload/offloaded_gb": stats.offloaded_bytes / GIB,
            "offload/offloaded_inputs": float(stats.offloaded_inputs),
            "offload/other_saved_gb": sum(stats.other_saved.values()) / GIB,
            "offload/kept_on_gpu_blocks": float(len(stats.kept_blocks(last_block))),
            "offload/kept_on_gpu_gb": stats.kept_bytes / GIB}


def describe_kept(kept: dict[int, str], names: Sequence[str]) -> str:
    """``"model.layers.15..model.layers.30 (16 blocks): host_cache_limit_gb reached"``, one
    clause per reason."""
    by_reason: dict[str, list[int]] = {}
    for block, reason in sorted(kept.items()):
        by_reason.setdefault(reason, []).append(block)
    return "; ".join(f"{_ranges(blocks, names)}: {reason}" for reason, blocks in by_reason.items())


def _ranges(blocks: list[int], names: Sequence[str]) -> str:
    runs: list[list[int]] = []
    for block in blocks:
        if runs and block == runs[-1][-1] + 1:
            runs[-1].append(block)
        else:
            runs.append([block])
    parts = [names[run[0]] if len(run) == 1 else f"{names[run[0]]}..{names[run[-1]]} ({len(run)} blocks)"
             for run in runs]
    return ", ".join(parts)
