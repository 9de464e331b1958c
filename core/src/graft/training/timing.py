"""Where ``time_to_first_step_s`` starts: the process's start for the first run in a process,
the run's own start for later ones (a notebook, a benchmark's second variant)."""

from __future__ import annotations

import os
import time
from pathlib import Path

_IMPORTED = time.monotonic()  # the fallback start: when Graft's training code was imported
_runs_started = 0


def process_age_s() -> float:
    """Seconds since this process started: from the kernel's start time on Linux (10 ms
    resolution; includes the interpreter's and torch's imports), else since this module was
    imported."""
    try:
        stat = Path("/proc/self/stat").read_text()
        # field 22, starttime in clock ticks after boot; fields counted after the "(comm)"
        started = int(stat.rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
        return time.clock_gettime(time.CLOCK_BOOTTIME) - started
    except (OSError, ValueError, IndexError, AttributeError):
        return time.monotonic() - _IMPORTED


class RunClock:
    """Started with a run: `seconds` since the process started (the process's first run) or
    since this clock was made (any later run in the same process)."""

    def __init__(self) -> None:
        global _runs_started
        self.first_in_process = _runs_started == 0
        _runs_started += 1
        self.created = time.monotonic()

    def seconds(self) -> float:
        """Seconds from the start (see the class) until now."""
        if self.first_in_process:
            return process_age_s()
        return time.monotonic() - self.created

    @property
    def origin(self) -> str:
        """What `seconds` counts from, for the console."""
        return "the start of the process" if self.first_in_process else "the start of the run"
