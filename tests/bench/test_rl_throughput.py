"""bench/rl_throughput.py ``--cold-warm`` on CPU (``--tiny``): its two fresh processes run
before the parent builds any model (on a GPU the parent's model left them no memory), and both
report a time to first step. A probe plugin, found through its entry point like any installed
plugin, logs which process builds a model when (``graft_pre_shard``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
PROBE = '''"""Logs the pid of every process that builds a model, in order."""

import os

from graft import hookimpl


@hookimpl
def graft_pre_shard(role):
    with open(os.environ["GRAFT_ORDER_PROBE_LOG"], "a") as log:
        log.write(f"{os.getpid()} {role}\\n")
'''


def probe_site(folder: Path) -> Path:
    """A folder holding the probe plugin as an installed distribution (a dist-info with its
    entry point), to put on PYTHONPATH."""
    folder.mkdir()
    (folder / "graft_order_probe.py").write_text(PROBE)
    info = folder / "graft_order_probe-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: graft-order-probe\n"
                                   "Version: 0.1\n")
    (info / "entry_points.txt").write_text("[graft.plugins]\norder-probe = graft_order_probe\n")
    return folder


@pytest.mark.slow  # three processes of the tiny run (~40 s on 2 cores)
def test_cold_warm_processes_run_before_the_parent_builds_a_model(tmp_path: Path) -> None:
    log, out = tmp_path / "built.log", tmp_path / "rl.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRAFT_")}
    env["PYTHONPATH"] = os.pathsep.join([str(probe_site(tmp_path / "site")),
                                         *filter(None, [env.get("PYTHONPATH")])])
    env["GRAFT_ORDER_PROBE_LOG"] = str(log)
    bench = subprocess.Popen(
        [sys.executable, str(BENCH / "rl_throughput.py"), "--tiny", "--cold-warm", "--no-sft",
         "--steps", "1", "--prompts", "2", "--n", "2", "--max-new-tokens", "4",
         "--out", str(out)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    stdout, stderr = bench.communicate(timeout=600)
    assert bench.returncode == 0, stderr[-3000:]
    builders = [int(line.split()[0]) for line in log.read_text().splitlines()]
    parent = builders.index(bench.pid)  # ValueError: the parent built no model
    children = builders[:parent]
    assert len(set(children)) == 2, builders  # cold, then warm: each built its model
    assert all(pid == bench.pid for pid in builders[parent:]), builders
    result = json.loads(out.read_text())
    assert [run["cache"] for run in result["cold_warm"]] == ["cold", "warm"]
    assert all(run["time_to_first_step_s"] is not None for run in result["cold_warm"])
    assert "time to first step, warm compile cache" in stdout
