"""bench/long_context.py's CPU smoke run (``--tiny --device cpu``): every variant's rows, the
step times against ``today``, and with ``--interleave-rounds`` the interleaved medians (one
step of each variant per round), so the GPU call that measures #26 does not fail on a typo."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.mark.slow
def test_the_tiny_run_times_the_variants_interleaved(tmp_path: Path) -> None:
    out = tmp_path / "lc.json"
    done = subprocess.run(
        [sys.executable, str(BENCH / "long_context.py"), "--tiny", "--device", "cpu",
         "--variants", "today", "chunked", "fused", "--lengths", "128", "256", "--steps", "1",
         "--interleave-rounds", "3", "--no-confirm", "--out", str(out)],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert {r["variant"] for r in result["rows"] if r["status"] == "ok"} == {"today", "chunked",
                                                                            "fused"}
    losses = {r["tokens"]: set() for r in result["rows"]}
    for r in result["rows"]:
        losses[r["tokens"]].add(round(r["loss"], 5))
    assert all(len(values) == 1 for values in losses.values()), losses  # same loss per length
    interleaved = result["step_time_interleaved"]
    assert result["interleave_rounds"] == 3
    for variant in ("today", "chunked", "fused"):
        for tokens in ("128", "256"):
            entry = interleaved[variant][tokens]
            assert len(entry["steps_s"]) == 3 and entry["median_s"] > 0
    assert result["command"].endswith(str(out))
