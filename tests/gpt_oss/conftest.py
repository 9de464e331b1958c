"""Worker scripts under torchrun, and the 2-rank run of `scripts/ep_equivalence.py` that several
tests read."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPTS = Path(__file__).resolve().parent / "scripts"


def run_ranks(script: str, *args: str, nproc: int = 2, timeout: float = 600) -> None:
    """``torchrun --nproc-per-node NPROC scripts/SCRIPT ARGS`` (gloo ranks); must succeed."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={nproc}", str(SCRIPTS / script), *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]


@pytest.fixture
def torchrun():
    """`run_ranks` for tests (conftest helpers are reached through fixtures)."""
    return run_ranks


@pytest.fixture(scope="session")
def ep_equivalence(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """What `scripts/ep_equivalence.py` saved: ep_size 1 and 2 trained alike, EP=2 exports."""
    out = tmp_path_factory.mktemp("ep-equivalence")
    run_ranks("ep_equivalence.py", str(out))
    return torch.load(out / "result.pt")
