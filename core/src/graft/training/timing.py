"""How long this process has been running (for ``time_to_first_step_s``)."""

from __future__ import annotations

import os
import time
from pathlib import Path

_IMPORTED = time.monotonic()  # the fallback start: when Graft's training code was imported


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
