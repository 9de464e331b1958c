"""Export under FSDP2 over two gloo ranks gives exactly the unsharded model's tensors, both
through the copy plan (equal row blocks) and through the per-parameter path (uneven shards)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "export_sharded.py"


@pytest.mark.parametrize(("vocab_size", "planned"), [(128, True), (129, False)])
def test_two_rank_export_equals_the_unsharded_tensors(tmp_path: Path, vocab_size: int,
                                                      planned: bool) -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
               str(SCRIPT), str(tmp_path), str(vocab_size)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    saved = torch.load(tmp_path / "export.pt")
    assert saved["planned"] is planned
    assert all(count > 1 for count in saved["buckets"]), saved["buckets"]
    weights, reference = saved["weights"], saved["reference"]
    assert weights.keys() == reference.keys()
    for name, tensor in reference.items():
        assert torch.equal(weights[name], tensor), name
