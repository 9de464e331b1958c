"""QAT's weights under FSDP2 on 2 gloo ranks (whole-tile shards quantised in place, without
gathering, on 1-D and 2-D meshes, and equal to the gathered path; others gathered once per step;
masters restored bit for bit): tests/deepseek_v4/scripts/sharded_weights.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent / "scripts" / "sharded_weights.py"


@pytest.mark.slow
def test_sharded_weights_quantise_like_the_full_weight() -> None:
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                             "--nproc-per-node=2", str(SCRIPT)], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rank 0: ok" in result.stdout and "rank 1: ok" in result.stdout
