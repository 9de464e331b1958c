"""``time_to_first_step_s`` counts from the ``graft`` command's start (also when a shell execs
it), from the process's start for a library call's first run, and from the run's own start for
later runs in the same process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

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


@pytest.mark.slow
def test_a_shell_that_sleeps_before_exec_graft_is_not_counted(tmp_path) -> None:
    # The shell's process becomes graft's (exec keeps the kernel's start time): the 4 s it
    # slept before are no part of graft's time to its first step.
    graft = Path(sys.executable).with_name("graft")
    command = (f"sleep 4; date +%s.%N > {tmp_path}/exec_at; exec {graft} train "
               f"trainer.run_dir={tmp_path}/run trainer.total_steps=1 trainer.mode=sft "
               f"model.preset=tiny-llama export.hf_at_end=false checkpoint.save_at_end=false")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRAFT_")}
    process = subprocess.Popen(["bash", "-c", command], stdout=subprocess.PIPE, text=True,
                               env=env, cwd=tmp_path)
    assert process.stdout is not None
    said_at = None
    for line in process.stdout:
        if line.startswith("time to first step:"):
            said_at = time.time()  # after the first step's end: the figure cannot be more
    assert process.wait() == 0 and said_at is not None
    exec_at = float((tmp_path / "exec_at").read_text())
    (row,) = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert 0 < row["time_to_first_step_s"] <= said_at - exec_at
