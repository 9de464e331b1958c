"""The workers of `graft_reward_pool.pool.RewardPool`: daemon threads, and Python processes that
run each reward in their main thread.

A worker scores the tasks it is sent one at a time and reports, for each, ``started`` (the
sample's clock starts), then ``done`` (the score) or ``error`` (the reward raised or returned no
finite number: `graft.rl.run_reward`). ``fatal`` says it cannot score at all: a module the
reward needs does not import. A process worker that ends just closes its socket; the pool reads
why.
"""

from __future__ import annotations

import importlib
import pickle
import queue
import threading
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from graft.errors import PluginError
from graft.rl import reward_name, run_reward

if TYPE_CHECKING:
    from graft.config import GraftConfig

# (the reward: a `graft.rl.RewardFunction`, the decoded response, the sample it answers)
RewardTask = tuple[Any, str, Any]


def _preload(reward: Any) -> None:
    """Import the modules the reward declares (once per worker: later imports are lookups)."""
    for module in reward.preload:
        importlib.import_module(module)


class ThreadWorker:
    """A daemon thread that scores the tasks put in its inbox, reporting to a shared outbox;
    the rewards get the root config ``cfg``."""

    def __init__(self, outbox: queue.SimpleQueue, *, cfg: GraftConfig) -> None:
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
            except BaseException as exc:  # noqa: BLE001 - handed to the caller, raised there
                self.outbox.put((self, "fatal", index, (exc, traceback.format_exc())))
                continue
            try:
                self.outbox.put((self, "started", index, None))
                value = run_reward(reward.fn, response, sample, cfg=self.cfg)
                self.outbox.put((self, "done", index, value))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                self.outbox.put((self, "error", index, (exc, traceback.format_exc())))

    def stop(self, *, abandon: bool = False) -> None:
        self.abandoned = abandon  # a stuck thread that wakes up drops the rest of its inbox
        self.inbox.put(None)  # a stuck thread never reads it; as a daemon it cannot block exit


class ProcessWorker:
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
        code = (f"from graft_reward_pool.workers import worker_main; "
                f"worker_main({theirs.fileno()})")
        self.process = subprocess.Popen([sys.executable, "-c", code], pass_fds=[theirs.fileno()],
                                        stdin=subprocess.DEVNULL, env=env)
        theirs.close()
        self.conn = Connection(ours.detach())
        self._send((config, preload))  # it imports `preload` while the parent goes on

    def send(self, index: int, task: RewardTask) -> None:
        try:
            self._send((index, task))
        except (pickle.PicklingError, AttributeError, TypeError) as exc:  # it does not pickle
            raise PluginError(f"the reward {reward_name(task[0].fn)} runs in worker processes "
                              f"(features.reward_pool.kind) but cannot be sent to one ({exc}): "
                              f"define it at module level, or set "
                              f"features.reward_pool.kind=thread") from exc

    def _send(self, message: Any) -> None:
        try:
            self.conn.send(message)
        except (BrokenPipeError, ConnectionResetError):
            pass  # it ended: its socket reads as closed, where the pool reports why

    def wait_exit(self) -> int | None:
        """The exit code of a worker whose socket closed (None if it still runs after 5 s)."""
        import subprocess

        try:
            return self.process.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            return None

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
    if not _report(conn, -1, lambda: [importlib.import_module(m) for m in preload]):
        return
    while True:
        try:
            item = conn.recv()  # unpickling imports the reward's module: before "started"
        except (EOFError, OSError):
            return
        except BaseException as exc:  # noqa: BLE001 - the reward's module does not import
            _send_error(conn, "fatal", -1, exc)
            return
        if item is None:
            return
        index, (reward, response, sample) = item
        if not _report(conn, index, lambda reward=reward: _preload(reward)):
            return
        try:
            conn.send(("started", index, None))
            conn.send(("done", index, run_reward(reward.fn, response, sample, cfg=cfg)))
        except BaseException as exc:  # noqa: BLE001 - handed to the parent
            _send_error(conn, "error", index, exc)


def _report(conn: Any, index: int, setup: Callable[[], Any]) -> bool:
    """Run a worker's ``setup`` (imports); on failure tell the parent (``fatal``) and say so."""
    try:
        setup()
    except BaseException as exc:  # noqa: BLE001 - handed to the parent, raised there
        _send_error(conn, "fatal", index, exc)
        return False
    return True


def _send_error(conn: Any, kind: str, index: int, exc: BaseException) -> None:
    trace = traceback.format_exc()
    try:
        conn.send((kind, index, (exc, trace)))
    except Exception:  # noqa: BLE001 - an exception that does not pickle
        conn.send((kind, index, (RuntimeError(f"{type(exc).__name__}: {exc}"), trace)))


def portable_config(cfg: GraftConfig) -> dict[str, Any]:
    """The root config as plain data for another process (the root schema class is built at run
    time and does not pickle); a worker reads it as a read-only OmegaConf config."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.structured(cfg))
