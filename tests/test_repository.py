"""Repository contracts: CI runs the README's commands; files stay small."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    return [block.strip() for block in blocks[:2]]


def test_ci_runs_the_readme_commands() -> None:
    install_and_run, run_tests = readme_commands()
    ci_lines = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    assert install_and_run in ci_lines
    assert run_tests in ci_lines
    assert ci_lines.index(install_and_run) < ci_lines.index(run_tests)


def test_python_files_stay_small() -> None:
    for path in REPO.glob("**/*.py"):
        if ".venv" in path.parts or "build" in path.parts:
            continue
        lines = len(path.read_text().splitlines())
        assert lines <= 450, f"{path.relative_to(REPO)} has {lines} lines; split it by concept"
