"""docs/plugins.md runs as written: its files are the example plugin in docs/examples/graft_myfeature,
installed here for real, and every command it shows is run against that install; its section 1
alone is a plugin that loads."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from graft import hookimpl
from graft.errors import PluginError
from graft.plugins import GraftPluginManager
from graft.testing import registered_plugin

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "plugins.md"
EXAMPLE = REPO / "docs" / "examples" / "graft_myfeature"
LANGUAGES = {".toml": "toml", ".py": "python", ".yaml": "yaml"}
# A file shown in the doc: a "File `PATH`:" line, a blank line, then a fenced block of it.
FILE_BLOCK = re.compile(r"^File `([^`]+)`:\n\n```(\w+)\n(.*?)^```$", re.M | re.S)
# Lines a later section appends to a file shown before (after two blank lines).
ADD_BLOCK = re.compile(r"^Add to `([^`]+)`:\n\n```(\w+)\n(.*?)^```$", re.M | re.S)
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.M | re.S)


def example_files() -> list[str]:
    """Every file of the example plugin, relative to its folder."""
    return sorted(str(p.relative_to(EXAMPLE)) for p in EXAMPLE.rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts and ".egg-info" not in str(p))


def doc_commands() -> list[str]:
    """The command lines of the doc's ``bash`` blocks, without comments."""
    lines = [line for lang, body in FENCE.findall(DOC.read_text()) if lang == "bash"
             for line in body.splitlines()]
    return [" ".join(shlex.split(line, comments=True)) for line in lines
            if shlex.split(line, comments=True)]


# Files of Graft's own test plugins the doc shows (paths from the repository's root).
REPO_FILE = "tests/plugins/"


def shown_files(text: str) -> dict[str, tuple[str, str]]:
    """Path -> (language, content) of every file the doc shows: its "File" block followed by
    each "Add to" block of it, in the doc's order."""
    shown = {path: (lang, body) for path, lang, body in FILE_BLOCK.findall(text)}
    for path, lang, body in ADD_BLOCK.findall(text):
        assert path in shown and shown[path][0] == lang, f"an addition to {path} before the file"
        shown[path] = (lang, shown[path][1] + "\n\n" + body)
    return shown


def test_the_doc_shows_every_example_file_verbatim() -> None:
    shown = shown_files(DOC.read_text())
    example = sorted(p for p in shown if not p.startswith(REPO_FILE))
    assert example == example_files(), "the doc must show the whole example plugin"
    for path, (lang, body) in shown.items():
        source = REPO / path if path.startswith(REPO_FILE) else EXAMPLE / path
        assert lang == LANGUAGES[Path(path).suffix], path
        assert body == source.read_text(), f"{path} differs from the doc's copy"


def test_every_code_block_is_a_tested_file_or_command() -> None:
    text = DOC.read_text()
    files = len(FILE_BLOCK.findall(text)) + len(ADD_BLOCK.findall(text))
    other = [lang for lang, _ in FENCE.findall(text) if lang != "bash"]
    assert len(other) == files, "a code block that is neither an example file nor bash commands"


def section(text: str, number: int) -> str:
    """The doc's section ``number`` (from its "## N." heading to the next heading)."""
    start = text.index(f"\n## {number}. ")
    return text[start:text.index("\n## ", start + 1)]


def test_section_1_alone_is_a_plugin_that_loads(run_graft, tmp_path: Path) -> None:
    """The files of section 1, as shown there, installed: the plugin loads with its section."""
    first = section(DOC.read_text(), 1)
    assert not ADD_BLOCK.findall(first)
    source = tmp_path / "graft_myfeature"
    for path, _, body in FILE_BLOCK.findall(first):
        (source / path).parent.mkdir(parents=True, exist_ok=True)
        (source / path).write_text(body)
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", "install",
                    "--no-deps", "--no-build-isolation", "--target", str(tmp_path / "site"),
                    str(source)], check=True)
    listed = run_graft(["plugins", "--json"], site=tmp_path / "site", cwd=source)
    assert listed.returncode == 0, listed.stderr[-2000:]
    (plugin,) = [p for p in json.loads(listed.stdout) if p["name"] == "myfeature"]
    assert (plugin["status"], plugin["error"]) == ("loaded", None)
    assert set(plugin["hooks"]) == {"graft_config_sections", "graft_pre_shard"}
    shown = run_graft(["config", "show", "features.myfeature.enabled=true"],
                      site=tmp_path / "site", cwd=source)
    assert shown.returncode == 0 and "    enabled: true\n" in shown.stdout, shown.stderr[-2000:]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a copy of the example plugin's folder, a site where it is installed from that copy)."""
    root = tmp_path_factory.mktemp("doc-plugin")
    source = root / "graft_myfeature"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", "install",
                    "--no-deps", "--no-build-isolation", "--target", str(root / "site"),
                    str(source)], check=True)
    shutil.rmtree(source / "build", ignore_errors=True)
    return source, root / "site"


# The doc's tiny chat model for its tool-calling environment (a python -c line).
WRITE_CHAT_MODEL = ("python -c from graft.testing import write_chat_checkpoint; from "
                    "graft_multiturn.templates import chat_template; write_chat_checkpoint("
                    "'chat-model', chat_template=chat_template('hermes'))")
# What to check in the output of each command the doc shows (beyond exit code 0).
EXPECTED = {
    "graft plugins": ("myfeature", "graft-myfeature", "features.myfeature"),
    "graft config show features.myfeature.enabled=true": (
        "  myfeature:\n    enabled: true\n    init_noise_std: 0.01",),
    "graft config check": ("myfeature-tiny.yaml", "config files valid"),
    "graft train --config myfeature-tiny": ("graft train: summary",),
    "graft train --config myfeature-rl": ("graft train: summary", "reward"),
    "graft train --config myfeature-env": ("graft train: summary", "reward"),
    WRITE_CHAT_MODEL: (),
    "graft train --config myfeature-tools model.path=chat-model": ("graft train: summary",
                                                                   "reward"),
}


@pytest.mark.slow
def test_every_command_of_the_doc_runs(run_graft, installed: tuple[Path, Path]) -> None:
    source, site = installed
    commands = doc_commands()
    assert set(EXPECTED) | {"pip install -e .", "pytest tests"} == set(commands)
    for command in commands:
        if command == "pip install -e .":
            continue  # done by the fixture, into a separate site
        if command == "pytest tests":
            result = run_example_tests(source, site)
        elif command == WRITE_CHAT_MODEL:
            result = subprocess.run([sys.executable, "-c", command.split(" -c ", 1)[1]],
                                    cwd=source, capture_output=True, text=True, timeout=300)
        else:
            result = run_graft(shlex.split(command)[1:], site=site, cwd=source)
        output = result.stdout + result.stderr
        assert result.returncode == 0, f"{command}:\n{output[-4000:]}"
        for expected in EXPECTED.get(command, ("passed",)):
            assert expected in result.stdout, f"{command}: no {expected!r} in\n{result.stdout}"
    check_tool_prompts(source)


def check_tool_prompts(source: Path) -> None:
    """The tool-calling run's prompts carry word_length's schema, rendered by the template."""
    (run,) = [path for path in (source / "runs").iterdir()
              if "environment: lengths" in (path / "config.yaml").read_text()]
    prompt = json.loads((run / "samples.jsonl").read_text().splitlines()[0])["prompt"]
    assert "<tools>" in prompt and '"name": "word_length"' in prompt, prompt


def run_example_tests(source: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """``pytest tests`` in the plugin's folder, with the plugin installed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRAFT_")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.run([sys.executable, "-m", "pytest", "tests", "-q", "-p", "no:cacheprovider"],
                          cwd=source, env=env, capture_output=True, text=True, timeout=300)


class Counter:
    """A plugin that counts the steps it sees."""

    def __init__(self) -> None:
        self.steps: list[int] = []

    @hookimpl
    def graft_step_begin(self, step):
        self.steps.append(step)


def test_registered_plugin_stands_in_for_a_loaded_plugin_of_that_name() -> None:
    manager = GraftPluginManager()
    manager.load(candidates=[])
    loaded, under_test = Counter(), Counter()
    manager.register(loaded, "counter", distribution="graft-counter", version="1.0")
    with registered_plugin(under_test, "counter", manager=manager):
        manager.hook.graft_step_begin(step=1)
    manager.hook.graft_step_begin(step=2)
    assert (loaded.steps, under_test.steps) == ([2], [1])
    assert manager.records["counter"].distribution == "graft-counter"
    with registered_plugin(loaded, "counter-again", manager=manager):  # same object, new name
        manager.hook.graft_step_begin(step=3)
    assert loaded.steps == [2, 3] and "counter-again" not in manager.records
    with pytest.raises(PluginError, match="built-in"):
        with registered_plugin(Counter(), "graft.losses.builtin", manager=manager):
            pass
