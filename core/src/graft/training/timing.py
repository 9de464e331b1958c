"""Where ``time_to_first_step_s`` starts: for the first run in a process, the start of the
``graft`` command that runs it (`mark_command_start`), else (a library call) the process's
start; the run's own start for later runs in the process (a notebook, a benchmark's second
variant)."""

from __future__ import annotations

import os
import time
from pathlib import Path

_IMPORTED = time.monotonic()  # the fallback start: when Graft's training code was imported
_runs_started = 0
_command_started: float | None = None


def mark_command_start(monotonic_s: float) -> None:
    """Count the first run's time from ``monotonic_s`` (a `time.monotonic` reading: the start
    of the ``graft`` command, taken by its entry point). The kernel's start time of the process
    would count from the fork of whatever exec'd it: a shell that slept or installed packages
    before ``exec graft`` passes its own start on."""
    global _command_started
    _command_started = monotonic_s


def process_age_s() -> float:
    """Seconds since this process started: from the kernel's start time on Linux (10 ms
    resolution; includes the interpreter's and torch's imports, and the life of a program
    that exec'd this one), else since this module was imported."""
    try:
        stat = Path("/proc/self/stat").read_text()
        # field 22, starttime in clock ticks after boot; fields counted after the "(comm)"
        started = int(stat.rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
        return time.clock_gettime(time.CLOCK_BOOTTIME) - started
    except (OSError, ValueError, IndexError, AttributeError):
        return time.monotonic() - _IMPORTED


class RunClock:
    """Started with a run: `seconds` since the ``graft`` command or the process started (the
    process's first run) or since this clock was made (any later run in the same process)."""

    def __init__(self) -> None:
        global _runs_started
        self.first_in_process = _runs_started == 0
        _runs_started += 1
        self.created = time.monotonic()

    def seconds(self) -> float:
        """Seconds from the start (see the class) until now."""
        if not self.first_in_process:
            return time.monotonic() - self.created
        if _command_started is not None:
            return time.monotonic() - _command_started
        return process_age_s()

    @property
    def origin(self) -> str:
        """What `seconds` counts from, for the console."""
        if not self.first_in_process:
            return "the start of the run"
        return ("the start of the graft command" if _command_started is not None
                else "the start of the process")
