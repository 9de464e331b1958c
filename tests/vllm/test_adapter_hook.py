"""``graft_rollout_adapter`` with the vLLM engine, without graft-lora: a test plugin's adapter
is written and loaded after every update, the base exported once, and an adapter vLLM cannot
load is a config error naming the plugin's fallback setting (`scripts/adapter_hook.py`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent / "scripts" / "adapter_hook.py"

pytestmark = pytest.mark.vllm


def run(tmp_path: Path, mode: str) -> dict:
    out = tmp_path / "result.json"
    result = subprocess.run([sys.executable, str(SCRIPT), str(out), str(tmp_path / "run"), mode],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(out.read_text())


def test_hook_graft_rollout_adapter_is_loaded_by_vllm_after_every_update(
        tmp_path: Path, requires_vllm: None) -> None:
    report = run(tmp_path, "serves")
    assert "error" not in report
    # the first export inside base_only, then the adapter at the start and after each update
    assert report["events"] == [["base_only", "base_only done", "write", "write", "write"]]
    rows = report["rows"]
    assert len(rows) == 2
    for row in rows:  # only the adapter file is synced
        assert row["weight_sync_mb"] == report["adapter_bytes"] / 1e6
        # the trainer has no adapter: vLLM generating with the plugin's moves its log-probs
        assert row["train_infer_logprob_diff"] > 1e-2


def test_hook_graft_rollout_adapter_vllm_cannot_load_is_a_config_error(
        tmp_path: Path, requires_vllm: None) -> None:
    report = run(tmp_path, "refused")
    error = report["error"]
    assert "cannot load the adapters on not_in_vllm" in error
    assert "vLLM refused them" in error and "expected target modules" in error
    assert "set the-test-plugin.sync=merged" in error
    assert report["rows"] == []
