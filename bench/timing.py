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


def graph_ms(fn: Callable[[], object], *, calls: int = 20, replays: int = 10) -> float:
    """Milliseconds per call of ``fn`` as a CUDA graph replays it (no launch cost on the host,
    as in the decode loop): ``calls`` calls captured once (after a warm-up on a side stream),
    the graph replayed ``replays`` times."""
    fn()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return replay_ms(graph, replays=replays) / calls


def replay_ms(graph: torch.cuda.CUDAGraph, *, replays: int, warmup: int = 1) -> float:
    """Milliseconds per replay of a captured ``graph``: ``warmup`` replays, then ``replays``
    timed."""
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(replays):
        graph.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - started) * 1e3 / replays
