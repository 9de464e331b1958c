"""The "Your own model and data" page's CPU commands (docs/own-model-and-data.md, once the
README's section), as written, in an empty folder (with the repository's examples/): they make
the tiny checkpoint and data, train with validation and samples, and check the example
configs."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MARKER = "<!-- own-data-commands -->"
PAGE = REPO / "docs" / "own-model-and-data.md"


def readme_commands() -> list[str]:
    text = PAGE.read_text()
    block = re.search(re.escape(MARKER) + r"\n```bash\n(.*?)\n```", text, re.S)
    assert block, f"{PAGE.relative_to(REPO)} has no bash block after {MARKER}"
    return block.group(1).splitlines()


@pytest.mark.slow  # a graft train process with math-verify workers (~40 s idle)
def test_the_readme_own_data_commands_run_as_written(tmp_path: Path) -> None:
    shutil.copytree(REPO / "examples", tmp_path / "examples")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRAFT_")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    commands = readme_commands()
    assert [c.split()[0] for c in commands] == ["python", "graft", "graft"]
    for command in commands:
        done = subprocess.run(command, shell=True, cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    run_dir = tmp_path / "runs" / "demo"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "val/reward_mean" in r] == [0, 2, 4]
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert {s["split"] for s in samples} == {"train", "val"}
    assert "2 config files valid" in done.stdout
