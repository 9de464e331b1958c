"""Running reward functions in a pool of threads or processes, each sample within a time limit.

Each worker scores one sample at a time and says when it starts one, so a sample's time limit
counts from its own start: not from the queue, and not the import of the reward's module and
of the modules it declares (`graft.rl.RewardFunction.preload`). A sample past the limit scores
0: a thread cannot be stopped, so it is abandoned (a daemon thread: it cannot hold the process
open at exit) and a new thread takes its place; a process is killed and replaced. Processes are
fresh Python interpreters (no fork of a process that holds CUDA or gloo state) and run each
reward in their main thread, where signal-based timeouts such as math-verify's work; threads do
not allow those.

A sample whose reward raises, returns no finite number, or kills its worker process is a
`graft.rl.RewardFailure` in the batch's result (it scores 0 there; Graft's reward scorer
decides, by ``algorithm.reward_errors``, whether the run goes on). A worker that cannot start
(a module the reward needs is missing) stops the batch with a `PluginError` naming the module
and the pip command; Graft's own errors (a sample without a ground truth) stop it as they are.
"""

from __future__ import annotations

import queue
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from graft.errors import GraftError, PluginError
from graft.plugins import install_hint
from graft.rl import RewardBatchResult, RewardFailure, debug_trace, reward_name
from graft_reward_pool.workers import ProcessWorker, RewardTask, ThreadWorker, portable_config

if TYPE_CHECKING:
    from graft.config import GraftConfig

__all__ = ["QUEUE_DEPTH", "PoolResult", "RewardPool"]

# Tasks sent ahead to each worker, at most: it never waits for the parent between samples (a
# round trip per sample cost more than a math-verify check on a busy machine); a stuck sample's
# followers are sent again to another worker. A small batch is spread over all the workers.
QUEUE_DEPTH = 8


@dataclass
class PoolResult(RewardBatchResult):
    """The scores of one batch, in order, the positions whose reward failed, with why, and the
    positions that ran past the time limit (both score 0)."""

    timed_out: list[int] = field(default_factory=list)


class RewardPool:
    """``workers`` threads or processes (``kind``) that score samples, each within
    ``timeout_s`` seconds; the rewards get the root config ``cfg``. Workers start on first
    use; `close` stops them."""

    def __init__(self, kind: str, *, workers: int, timeout_s: float, cfg: GraftConfig) -> None:
        if kind not in ("thread", "process"):
            raise ValueError(f"unknown reward pool kind {kind!r}")
        self.kind, self.size, self.timeout_s, self.cfg = kind, workers, timeout_s, cfg
        self.workers: list[Any] = []
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._config: dict[str, Any] | None = None
        self._preload: tuple[str, ...] = ()

    def score(self, tasks: Sequence[RewardTask]) -> PoolResult:
        """Score every task. A failing reward is a `RewardFailure` of the result; a reward's
        `GraftError`, or a worker that cannot start, is raised here (the batch stops)."""
        result = PoolResult([0.0] * len(tasks))
        waiting = deque(range(len(tasks)))
        queued: dict[Any, deque[int]] = {}  # worker -> the indices sent to it, in order
        running: dict[Any, tuple[int, float]] = {}  # worker -> (started index, its deadline)
        while waiting or any(queued.values()):
            self._dispatch(tasks, waiting, queued)
            for worker, kind, index, payload in self._events(queued, running):
                if worker not in queued or (index >= 0 and index not in queued[worker]):
                    continue  # an abandoned worker answering late
                if kind == "started":
                    running[worker] = (index, time.monotonic() + self.timeout_s)
                elif kind == "done" or (kind == "error" and not isinstance(payload[0],
                                                                           GraftError)):
                    if kind == "done":
                        result.scores[index] = payload
                    else:
                        result.failures[index] = RewardFailure.from_exception(*payload)
                    queued[worker].remove(index)
                    running.pop(worker, None)
                elif kind == "died":
                    self._died(worker, payload, queued, running, waiting, result)
                else:  # Graft's own error, or a worker that cannot import what it needs
                    for other in list(queued):  # their late answers must not reach a later batch
                        self._drop(other, abandon=True)
                    self._raise(payload, tasks[index] if index >= 0 else None)
            self._expire(queued, running, waiting, result)
        result.timed_out.sort()
        return result

    def _dispatch(self, tasks: Sequence[RewardTask], waiting: deque, queued: dict) -> None:
        """Spread the waiting tasks over the pool's workers (started up to its size), up to
        `QUEUE_DEPTH` in each (so none waits for the parent between samples)."""
        pending = len(waiting) + sum(map(len, queued.values()))
        if not waiting:
            return
        while len(self.workers) < min(self.size, pending):
            self._start_worker()
        depth = min(QUEUE_DEPTH, -(-pending // len(self.workers)))
        for worker in self.workers:
            mine = queued.setdefault(worker, deque())
            while waiting and len(mine) < depth:
                index = waiting.popleft()
                worker.send(index, tasks[index])
                mine.append(index)

    def start(self, preload: tuple[str, ...] = ()) -> None:
        """Start every worker now (processes import ``preload`` while the caller goes on), so
        the first batch does not wait for them."""
        self._preload = tuple(dict.fromkeys((*self._preload, *preload)))
        while len(self.workers) < self.size:
            self._start_worker()

    def _start_worker(self) -> Any:
        if self.kind == "thread":
            worker = ThreadWorker(self._outbox, cfg=self.cfg)
        else:
            if self._config is None:
                self._config = portable_config(self.cfg)
            worker = ProcessWorker(self._config, self._preload)
        self.workers.append(worker)
        return worker

    def _events(self, queued: dict, running: dict) -> list[tuple[Any, str, int, Any]]:
        """The workers' messages that arrive before the nearest deadline (all of them that are
        there once one is)."""
        deadlines = [deadline for _, deadline in running.values()]
        timeout = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
        if self.kind == "thread":
            try:
                events = [self._outbox.get(timeout=timeout)]
            except queue.Empty:
                return []
            while not self._outbox.empty():
                events.append(self._outbox.get_nowait())
            return events
        return self._process_events([w for w, mine in queued.items() if mine], timeout)

    def _process_events(self, workers: list[Any],
                        timeout: float | None) -> list[tuple[Any, str, int, Any]]:
        from multiprocessing.connection import wait

        by_conn = {worker.conn: worker for worker in workers}
        events = []
        for conn in wait(list(by_conn), timeout):
            worker = by_conn[conn]
            try:
                while True:
                    kind, index, payload = conn.recv()
                    events.append((worker, kind, index, payload))
                    if not conn.poll():
                        break
            except (EOFError, OSError):  # it ended: after what it said before (in `events`)
                events.append((worker, "died", -1, worker.wait_exit()))
        return events

    def _died(self, worker: Any, code: int | None, queued: dict, running: dict, waiting: deque,
              result: PoolResult) -> None:
        """A worker process ended: the sample it ran fails, the ones queued behind it go back
        to the front of the line; one that ended before any sample stops the batch."""
        started = running.pop(worker, None)
        behind = queued.pop(worker)
        self._drop(worker)
        how = f"exit code {code}" if code is None or code >= 0 else f"killed by signal {-code}"
        if started is None:
            for other in list(queued):
                self._drop(other, abandon=True)
            raise PluginError(f"a reward worker process ended ({how}) while it ran no sample "
                              f"(at its start or between samples); its output above says why")
        result.failures[started[0]] = RewardFailure("died", how)
        waiting.extendleft(reversed([i for i in behind if i != started[0]]))

    def _expire(self, queued: dict, running: dict, waiting: deque, result: PoolResult) -> None:
        """Score 0 for every sample past its deadline; its worker is replaced and the samples
        queued behind it go back to the front of the line."""
        now = time.monotonic()
        for worker, (index, deadline) in list(running.items()):
            if now >= deadline:
                result.timed_out.append(index)
                del running[worker]
                behind = [i for i in queued.pop(worker) if i != index]
                waiting.extendleft(reversed(behind))
                self._drop(worker, abandon=True)

    def _drop(self, worker: Any, *, abandon: bool = False) -> None:
        self.workers.remove(worker)
        worker.stop(abandon=abandon)

    def _raise(self, payload: tuple[BaseException, str], task: RewardTask | None) -> None:
        """Raise Graft's user errors as they are; a worker that could not import what the
        reward needs as a `PluginError` naming the module (and the pip command)."""
        exc, trace = payload
        if isinstance(exc, GraftError):
            raise exc
        reward = f"the reward {reward_name(task[0].fn)}" if task is not None else "a reward"
        if isinstance(exc, ImportError) and exc.name:
            raise PluginError(f"a reward worker ({self.kind}) could not import the module "
                              f"{exc.name!r}, which {reward} needs ({type(exc).__name__}: "
                              f"{exc}): {install_hint(exc.name)}{debug_trace(trace)}")
        raise PluginError(f"a reward worker ({self.kind}) could not load {reward}: "
                          f"{RewardFailure.from_exception(exc, trace).detail}{debug_trace(trace)}")

    def close(self) -> None:
        """Stop every worker (idempotent)."""
        for worker in list(self.workers):
            self._drop(worker)
