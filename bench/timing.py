"""What the benchmarks share for timing: device syncs, a timed loop, freeing cached memory.

Imported by the scripts in this folder as ``import timing`` (Python puts a script's own folder
first on its path).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

import torch


def sync(device: torch.device) -> None:
    """Wait for the work queued on ``device`` (nothing to wait for on a CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], *, warmup: int, steps: int, device: torch.device) -> float:
    """Mean seconds per call of ``fn`` over ``steps`` calls, after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    sync(device)
    started = time.perf_counter()
    for _ in range(steps):
        fn()
    sync(device)
    return (time.perf_counter() - started) / steps


def release(device: torch.device) -> None:
    """Drop unreferenced objects and return the caching allocator's free blocks."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def interleaved(fns: dict[str, Callable[[], object]], *, rounds: int,
                device: torch.device) -> dict[str, list[float]]:
    """Seconds of each call of every ``fns`` entry over ``rounds`` rounds, one call of each per
    round, the order rotated every round: a drift of the clock or the temperature over the run
    then falls on every entry alike (a variant's steps timed back to back, then the next
    variant's, charged it to whichever ran last). Call each once before, to warm up."""
    names = list(fns)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for index in range(rounds):
        shift = index % max(len(names), 1)
        for name in names[shift:] + names[:shift]:
            sync(device)
            started = time.perf_counter()
            fns[name]()
            sync(device)
            seconds[name].append(time.perf_counter() - started)
    return seconds
