"""bench/gpu/profile_update.py on CPU (``--tiny``): the profiler starts at the asked update's first
pass and stops at the next rollout, so it reports that update's operators and wall time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.mark.slow  # a tiny 3-step LoRA RL run (~15 s on 2 cores)
def test_the_asked_update_is_profiled(tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    done = subprocess.run([sys.executable, str(BENCH / "gpu" / "profile_update.py"), "--tiny",
                           "--step", "2", "--out", str(out)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert len(result["history"]) == 3 and result["step"] == 2
    assert result["update_wall_s"] > 0 and result["kernels"] > 0 and result["top"]
