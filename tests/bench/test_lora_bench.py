"""bench/lora.py on CPU (``--tiny``): each part in a process of its own writes its row; the
LoRA run trains only its adapters, full fine-tuning all of the model. (The TRL part needs TRL,
which CI does not install.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_the_parts_run_in_their_own_processes_and_report(tmp_path: Path) -> None:
    out = tmp_path / "lora.json"
    done = subprocess.run([sys.executable, str(BENCH / "lora.py"), "--parts", "graft", "full",
                           "--limits", "200", "200", "--tiny", "--steps", "3", "--warmup", "2",
                           "--prompts", "2", "--n", "2", "--max-new-tokens", "6", "--rank", "4",
                           "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    parts = json.loads(out.read_text())["parts"]
    lora, full = parts["graft"], parts["full"]
    assert lora["lora"] and 0 < lora["trained_parameters"] < lora["parameters"]
    assert not full["lora"] and full["fits"] and full["trained_parameters"] == full["parameters"]
    for row in (lora, full):
        assert row["samples_per_step"] == 4 and row["step_s"] > 0
        assert row["rollout_tokens_per_s"] > 0 and row["update_tokens_per_s"] > 0
        assert abs(row["step_s"] - row["step_s_per_step"][2]) < 1e-3  # the 2 warm-up steps out
    result = json.loads(out.read_text())
    assert "headline" not in result and "TRL" not in result["measures"]  # no TRL row to compare
