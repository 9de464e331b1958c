"""A ``graft train`` run that a test reads line by line and interrupts as a user's Ctrl-C does."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# Only against a run that hangs: a test waits for the run's own output, never for a duration.
LAST_RESORT_S = 1200


def _sigint_as_in_a_terminal() -> None:
    # A test run started in the background of a shell inherits SIGINT ignored, and so would the
    # run (Python then installs no KeyboardInterrupt handler): Ctrl-C would do nothing.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class LiveRun:
    """``python -m graft ARGS`` in its own process group, stdout and stderr in one stream."""

    def __init__(self, args: list[str], *, cwd: Path) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GRAFT_")}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "graft", *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, start_new_session=True,
            preexec_fn=_sigint_as_in_a_terminal)
        self.lines: list[str] = []
        self._queue: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._queue.put(line)
        self._queue.put(None)  # the run closed its output: it has ended

    @property
    def output(self) -> str:
        """Everything the run printed so far."""
        return "".join(self.lines)

    def wait_for(self, pattern: str) -> str:
        """Read the run's output until a line matches ``pattern`` (a regex); return that line.
        Fails if the run ends first."""
        deadline = time.monotonic() + LAST_RESORT_S
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                self.process.wait()
                pytest.fail(f"the run ended (exit code {self.process.returncode}) before a line "
                            f"matched {pattern!r}:\n{self.output[-3000:]}")
            self.lines.append(line)
            if re.search(pattern, line):
                return line
        pytest.fail(f"no line matched {pattern!r} in {LAST_RESORT_S} s:\n{self.output[-3000:]}")

    def interrupt(self) -> None:
        """Ctrl-C: SIGINT to the run's whole process group, as a terminal sends it."""
        os.killpg(self.process.pid, signal.SIGINT)

    def finish(self) -> int:
        """Read the rest of the output until the run exits; return its exit code."""
        while (line := self._queue.get(timeout=LAST_RESORT_S)) is not None:
            self.lines.append(line)
        return self.process.wait(timeout=LAST_RESORT_S)

    def kill(self) -> None:
        """Stop the run if it is still going (the test failed)."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


@pytest.fixture
def live_graft() -> Iterator[Callable[..., LiveRun]]:
    """Start `LiveRun`s; any still running when the test ends are killed."""
    runs: list[LiveRun] = []

    def start(args: list[str], *, cwd: Path) -> LiveRun:
        runs.append(LiveRun(args, cwd=cwd))
        return runs[-1]

    yield start
    for run in runs:
        run.kill()
