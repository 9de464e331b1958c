"""Running reward functions in a pool of threads or processes, each sample within a time limit.

Each worker scores one sample at a time and says when it starts one, so a sample's time limit
counts from its own start: not from the queue, and not the import of the reward's module and
of the modules it declares (`graft.rl.RewardFunction.preload`). A sample past the limit scores
0: a thread cannot be stopped, so it is abandoned (a daemon thread: it cannot hold the process
open at exit) and a new thread takes its place; a process is killed and replaced. Processes are
fresh Python interpreters (no fork of a process that holds CUDA or gloo state) and run each
reward in their main thread, where signal-based timeouts such as math-verify's work; threads do
not allow those.
"""

from __future__ import annotations

import importlib
import pickle
import queue
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from graft.errors import GraftError, PluginError
from graft.plugins.keywords import call_with_keywords

# (the reward: a `graft.rl.rewards.RewardFunction`, the decoded response, the sample it answers)
RewardTask = tuple[Any, str, Any]
# Tasks sent ahead to each worker: it never waits for the parent between samples (a round trip
# per sample cost more than a math-verify check on a busy machine); a stuck sample's followers
# are sent again to another worker.
QUEUE_DEPTH = 8


@dataclass
class PoolResult:
    """The scores of one batch, in order, and the positions that ran past the time limit (their
    score is 0)."""

    scores: list[float]
    timed_out: list[int] = field(default_factory=list)


def run_reward(fn: Callable[..., float], response: str, sample: Any, cfg: Any) -> float:
    """``fn`` called with the keywords it declares of ``response``, ``sample`` and ``cfg``,
    as a float."""
    value = call_with_keywords(fn, response=response, sample=sample, cfg=cfg)
    try:
        return float(value)
    except (TypeError, ValueError) as exc:
        raise PluginError(f"the reward {_name(fn)} returned {value!r} for "
                          f"{getattr(sample, 'origin', '') or 'a sample'}; a reward returns a "
                          f"number") from exc


def _name(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _preload(reward: Any) -> None:
    """Import the modules the reward declares (once per worker: later imports are lookups)."""
    for module in reward.preload:
        importlib.import_module(module)


class _ThreadWorker:
    """A daemon thread that scores the tasks put in its inbox, reporting to a shared outbox."""

    def __init__(self, outbox: queue.SimpleQueue, cfg: Any) -> None:
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.outbox, self.cfg = outbox, cfg
        self.abandoned = False
        threading.Thread(target=self._loop, name="graft-reward", daemon=True).start()

    def send(self, index: int, task: RewardTask) -> None:
        self.inbox.put((index, task))

    def _loop(self) -> None:
        while (item := self.inbox.get()) is not None and not self.abandoned:
            index, (reward, response, sample) = item
            try:
                _preload(reward)
                self.outbox.put((self, "started", index, None))
                value = run_reward(reward.fn, response, sample, self.cfg)
                self.outbox.put((self, "done", index, value))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller, raised there
                self.outbox.put((self, "error", index, (exc, traceback.format_exc())))

    def stop(self, *, abandon: bool = False) -> None:
        self.abandoned = abandon  # a stuck thread that wakes up drops the rest of its inbox
        self.inbox.put(None)  # a stuck thread never reads it; as a daemon it cannot block exit


class _ProcessWorker:
    """A Python process that scores the tasks it receives on a socket, in its main thread.

    Started as ``python -c`` with the parent's ``sys.path`` (not multiprocessing's spawn, which
    would import the parent's ``__main__`` again: a user's training script without a
    ``__main__`` guard would start training in every worker).
    """

    def __init__(self, config: dict[str, Any], preload: tuple[str, ...] = ()) -> None:
        import os
        import socket
        import subprocess
        import sys
        from multiprocessing.connection import Connection

        ours, theirs = socket.socketpair()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        code = f"from graft.rl.reward_pool import worker_main; worker_main({theirs.fileno()})"
        self.process = subprocess.Popen([sys.executable, "-c", code], pass_fds=[theirs.fileno()],
                                        stdin=subprocess.DEVNULL, env=env)
        theirs.close()
        self.conn = Connection(ours.detach())
        self.conn.send((config, preload))  # it imports `preload` while the parent goes on

    def send(self, index: int, task: RewardTask) -> None:
        try:
            self.conn.send((index, task))
        except (pickle.PicklingError, AttributeError, TypeError) as exc:  # it does not pickle
            raise PluginError(f"the reward {_name(task[0].fn)} runs in worker processes "
                              f"(algorithm.reward_pool) but cannot be sent to one ({exc}): define "
                              f"it at module level, or set algorithm.reward_pool=thread") from exc

    def exit_code(self) -> int | None:
        return self.process.poll()

    def stop(self, *, abandon: bool = False) -> None:
        import subprocess

        if not abandon and self.process.poll() is None:
            try:
                self.conn.send(None)
                self.process.wait(timeout=2.0)
            except (OSError, subprocess.TimeoutExpired):
                pass
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=5.0)
        self.conn.close()


def worker_main(fd: int) -> None:
    """A reward worker process (on socket ``fd``): read the config and import the modules to
    preload, then score until told to stop or the parent goes away."""
    import signal
    from multiprocessing.connection import Connection

    from omegaconf import OmegaConf

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    conn = Connection(fd)
    try:
        config, preload = conn.recv()
    except (EOFError, OSError):
        return
    cfg = OmegaConf.create(config)
    OmegaConf.set_readonly(cfg, True)
    for module in preload:
        importlib.import_module(module)
    while True:
        try:
            item = conn.recv()  # unpickling imports the reward's module: before "started"
        except (EOFError, OSError):
            return
        if item is None:
            return
        index, (reward, response, sample) = item
        try:
            _preload(reward)
            conn.send(("started", index, None))
            conn.send(("done", index, run_reward(reward.fn, response, sample, cfg)))
        except BaseException as exc:  # noqa: BLE001 - handed to the parent, raised there
            trace = traceback.format_exc()
            try:
                conn.send(("error", index, (exc, trace)))
            except Exception:  # noqa: BLE001 - an exception that does not pickle
                conn.send(("error", index, (RuntimeError(repr(exc)), trace)))


def portable_config(cfg: Any) -> dict[str, Any]:
    """The config as plain data for another process (the root schema class is built at run
    time and does not pickle); a worker reads it as a read-only OmegaConf config."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.structured(cfg))


class RewardPool:
    """``workers`` threads or processes (``kind``) that score samples, each within
    ``timeout_s`` seconds. Workers start on first use; `close` stops them."""

    def __init__(self, kind: str, *, workers: int, timeout_s: float, cfg: Any) -> None:
        if kind not in ("thread", "process"):
            raise ValueError(f"unknown reward pool kind {kind!r}")
        self.kind, self.size, self.timeout_s, self.cfg = kind, workers, timeout_s, cfg
        self.workers: list[Any] = []
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._config: dict[str, Any] | None = None
        self._preload: tuple[str, ...] = ()

    def score(self, tasks: Sequence[RewardTask]) -> PoolResult:
        """Score every task; a reward's error is raised here (after the batch stops)."""
        result = PoolResult([0.0] * len(tasks))
        waiting = deque(range(len(tasks)))
        queued: dict[Any, deque[int]] = {}  # worker -> the indices sent to it, in order
        running: dict[Any, tuple[int, float]] = {}  # worker -> (started index, its deadline)
        while waiting or any(queued.values()):
            self._dispatch(tasks, waiting, queued)
            for worker, kind, index, payload in self._events(queued, running):
                if index not in queued.get(worker, ()):
                    continue  # an abandoned worker answering late
                if kind == "started":
                    running[worker] = (index, time.monotonic() + self.timeout_s)
                elif kind == "done":
                    result.scores[index] = payload
                    queued[worker].remove(index)
                    running.pop(worker, None)
                else:
                    for other in list(queued):  # their late answers must not reach a later batch
                        self._drop(other, abandon=True)
                    self._raise(payload, tasks[index])
            self._expire(queued, running, waiting, result)
        result.timed_out.sort()
        return result

    def _dispatch(self, tasks: Sequence[RewardTask], waiting: deque, queued: dict) -> None:
        """Keep up to `QUEUE_DEPTH` tasks in every worker (so none waits for the parent between
        samples), starting workers up to the pool's size."""
        while len(self.workers) < min(self.size, len(waiting) + sum(map(len, queued.values()))):
            self._start_worker()
        for worker in self.workers:
            mine = queued.setdefault(worker, deque())
            while waiting and len(mine) < QUEUE_DEPTH:
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
            worker = _ThreadWorker(self._outbox, self.cfg)
        else:
            if self._config is None:
                self._config = portable_config(self.cfg)
            worker = _ProcessWorker(self._config, self._preload)
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
            except (EOFError, OSError):
                code = worker.exit_code()
                self._drop(worker)
                raise RuntimeError(f"a reward worker process died (exit code {code}) while "
                                   f"scoring a batch") from None
        return events

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

    def _raise(self, payload: tuple[BaseException, str], task: RewardTask) -> None:
        """Raise a reward's error: Graft's user errors as they are, others with their trace."""
        exc, trace = payload
        if isinstance(exc, GraftError):
            raise exc
        origin = getattr(task[2], "origin", "") or "a sample"
        raise RuntimeError(f"the reward {_name(task[0].fn)} failed on {origin}:\n{trace}") from exc

    def close(self) -> None:
        """Stop every worker (idempotent)."""
        for worker in list(self.workers):
            self._drop(worker)
