"""Repository contracts: CI runs the README's commands (both legs, between them every test, the
version-dependent ones on both transformers); files stay small."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VLLM_REQUIRED = "export GRAFT_REQUIRE_VLLM=1"
VLLM_OPTIONAL = "unset GRAFT_REQUIRE_VLLM"
TRITON_REQUIRED = "export GRAFT_REQUIRE_TRITON=1"


def readme_commands() -> list[str]:
    """The Quick start's commands: install and run, the tests, the tests on the newest
    transformers."""
    blocks = re.findall(r"```bash\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    return [block.strip() for block in blocks[:3]]


def code_lines(text: str) -> list[str]:
    """Lines without their comments, blank ones dropped."""
    return [code for line in text.splitlines() if (code := line.split("#")[0].strip())]


def requirements(name: str) -> list[str]:
    return code_lines((REPO / name).read_text())


def test_ci_runs_the_readme_commands() -> None:
    install_and_run, run_tests, newest = readme_commands()
    ci_lines = code_lines((REPO / ".ci" / "run").read_text())
    for command in (install_and_run, run_tests, newest):
        assert command in ci_lines, f".ci/run does not run the README command {command!r}"
    # leg one: vLLM's tests must run (not skip); leg two has no vLLM and deselects them
    # leg two: the Triton kernels' interpreter tests must run (triton is in its requirements)
    order = [ci_lines.index(line) for line in (install_and_run, VLLM_REQUIRED, run_tests,
                                               VLLM_OPTIONAL, TRITON_REQUIRED, newest)]
    assert order == sorted(order), ci_lines
    assert "requirements-newest.txt" in newest and "pytest" in newest
    # leg one: vLLM's and the version-dependent tests; leg two: every test but vLLM's
    assert run_tests.endswith('python -m pytest -n 2 -m "vllm or transformers_versions"')
    assert newest.endswith('python -m pytest -n 2 -m "not vllm"')


def test_the_version_dependent_tests_exist() -> None:
    """tests/conftest.py marks them by path: a renamed file would drop out of the oldest leg."""
    tree = ast.parse((REPO / "tests" / "conftest.py").read_text())
    (paths,) = [ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                and any(getattr(t, "id", "") == "TRANSFORMERS_VERSIONS" for t in node.targets)]
    assert paths and all((REPO / path).is_file() for path in paths), paths


# Test modules of plugins/vllm that need graft-vllm but not vLLM, left unmarked so that README
# command 3 (graft-vllm installed without vLLM, the newest transformers) runs them.
VLLM_PLUGIN_ONLY = {"test_delta.py"}


def test_the_vllm_tests_are_marked() -> None:
    """Every test module of plugins/vllm carries the `vllm` marker (README command 2 selects by
    it, command 3 deselects it), except those of `VLLM_PLUGIN_ONLY`, which must not."""
    for path in (REPO / "tests" / "vllm").glob("test_*.py"):
        marked = "pytestmark = pytest.mark.vllm" in path.read_text()
        assert marked != (path.name in VLLM_PLUGIN_ONLY), path


def test_the_newest_leg_installs_the_development_install_without_vllm() -> None:
    dev = [line for line in requirements("requirements-dev.txt") if not line.startswith("vllm")]
    newest = requirements("requirements-newest.txt")
    (pin,) = [line for line in newest if line.startswith("transformers")]
    # Triton comes with vLLM in the first venv; the Triton interpreter tests need it here too
    (triton,) = [line for line in newest if line.startswith("triton")]
    assert [line for line in newest if line not in (pin, triton)] == dev, (
        "requirements-newest.txt must list every line of requirements-dev.txt except vLLM's")
    version = re.fullmatch(r"transformers==(\d+\.\d+)\.\*", pin)
    assert version, f"pin one transformers release line (transformers==X.Y.*), not {pin!r}"
    quick_start = (REPO / "README.md").read_text().split("## Quick start")[1].split("\n## ")[0]
    assert f"transformers {version[1]}" in quick_start, "the README must say it is tested"



def test_python_files_stay_small() -> None:
    for path in REPO.glob("**/*.py"):
        if any(part.startswith(".venv") for part in path.parts) or "build" in path.parts:
            continue
        lines = len(path.read_text().splitlines())
        assert lines <= 450, f"{path.relative_to(REPO)} has {lines} lines; split it by concept"
