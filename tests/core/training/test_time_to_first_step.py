"""``time_to_first_step_s`` counts from the process's start for its first run and from the run's
own start for later runs in the same process."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from graft.training.timing import RunClock, process_age_s

CHILD = ("import time; time.sleep(1.0); from graft.training.timing import RunClock; "
         "clock = RunClock(); print(clock.first_in_process, clock.seconds())")


def test_the_first_run_of_a_process_counts_from_the_process_start() -> None:
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                         check=True).stdout.split()
    wall = time.monotonic() - started
    assert out[0] == "True"
    # the sleep and the imports before the clock count; the kernel keeps a process's start in
    # clock ticks (10 ms), so the child may count up to a tick more than the parent saw
    tick_s = 1 / os.sysconf("SC_CLK_TCK")
    assert 1.0 <= float(out[1]) <= wall + tick_s


def test_a_later_run_counts_from_its_own_start() -> None:
    RunClock()
    later = RunClock()
    assert not later.first_in_process and later.origin == "the start of the run"
    assert later.seconds() < process_age_s()
