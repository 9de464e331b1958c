"""bench/decode_step.py on CPU (``--tiny``): both variants' decode loops run at each batch size
and report their loops' times and the operators of a step, the exact one inside graft-exact's
mode."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.mark.slow  # two tiny models decode a few hundred tokens (~15 s on 2 cores)
def test_decode_step_reports_each_variant_at_each_batch_size(tmp_path: Path) -> None:
    out = tmp_path / "decode_step.json"
    done = subprocess.run([sys.executable, str(BENCH / "decode_step.py"), "--tiny", "--batches",
                           "1", "3", "--tokens", "8", "24", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    variants = json.loads(out.read_text())["variants"]
    assert set(variants) == {"default", "exact"}
    for variant, rows in variants.items():
        assert set(rows) == {"1", "3"}
        for row in rows.values():
            # the step time is a difference of two loops' times: on a busy CPU it may be <= 0
            assert all(seconds > 0 for seconds in row["loop_s"].values()) and row["kernels"] > 0
            assert row["exact_mode"] is (variant == "exact")
