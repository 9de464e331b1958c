"""The documentation site: it builds with ``mkdocs build --strict``, its configuration reference
is the schema's, and every code block of its pages runs (docs/plugins.md has its own tests,
tests/docs/test_plugin_docs.py).

A page's code blocks run in order in a folder of their own holding a copy of ``examples/``; an
HTML comment right above a block says how it is used:

- none: a ``bash`` block's lines run and must exit 0; a ``python`` block runs as a script;
- ``<!-- file: PATH -->``: the block is written to PATH (a config file a later command reads);
- ``<!-- exit N: TEXT -->``: the ``bash`` block's command must exit N with TEXT in its stderr;
- ``<!-- check: WHY -->``: the block cannot run here (GPUs, several nodes, an install, your own
  paths): each ``graft`` command in it is parsed as the CLI parses it and its config composed
  (so every key, value and config file it names must be valid), the rest must parse as shell;
- ``<!-- own-data-commands -->``: run by tests/test_readme_own_data.py.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
# Pages with tests of their own (plugins.md) or without code (design.md describes the layout).
OTHER_TESTS = {"plugins.md", "design.md"}
PAGES = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.glob("**/*.md")
               if p.name not in OTHER_TESTS and "examples" not in p.parts)
BLOCK = re.compile(r"(?:^<!-- ([\w-]+):? ?(.*?) -->\n)?^```(\w*)\n(.*?)^```$", re.M | re.S)
# Pages whose commands take more than ~20 s on 2 busy cores (graft train runs).
SLOW = {"checkpoints.md", "curves.md", "parallelism.md"}


def blocks(page: str) -> list[tuple[str, str, str, str]]:
    """(marker, its argument, language, body) of each fenced block of ``page``."""
    return [(marker or "", argument or "", lang, body)
            for marker, argument, lang, body in BLOCK.findall((DOCS / page).read_text())]


def test_every_page_is_in_the_nav_and_every_block_is_tested() -> None:
    nav = (REPO / "mkdocs.yml").read_text()
    for page in [*PAGES, *OTHER_TESTS]:
        assert f" {page}\n" in nav, f"docs/{page} is not in mkdocs.yml's nav"
    for page in PAGES:
        for marker, _, lang, _ in blocks(page):
            assert marker in ("", "file", "exit", "check", "own-data-commands"), (page, marker)
            assert lang in ("bash", "python", "yaml", "json"), f"{page}: ```{lang} runs nowhere"
            assert lang not in ("yaml", "json") or marker in ("file", "check"), (
                f"{page}: a {lang} block must be a file (<!-- file: PATH -->)")


def graft_commands(line: str) -> list[list[str]]:
    """The argument lists of the ``graft`` commands of a shell line (``a && graft b``)."""
    words = shlex.split(line, comments=True)
    commands, current = [], []
    for word in [*words, "&&"]:
        if word in ("&&", "||", ";", "|"):
            commands.append(current)
            current = []
        else:
            current.append(word)
    env_free = [[w for w in c if not re.fullmatch(r"[A-Z_]+=.*", w)] for c in commands]
    return [c[1:] for c in env_free if c and c[0] == "graft"]


def check_graft_command(args: list[str]) -> None:
    """Parse ``graft ARGS`` as the CLI does; compose the config of train and config show."""
    from graft.cli.common import collect_overrides
    from graft.cli.main import build_parser
    from graft.config import compose

    try:
        parsed, extra = build_parser(args).parse_known_args(args)
    except SystemExit as stop:  # --version, --help; argparse's errors exit 2
        assert stop.code == 0, f"graft {' '.join(args)} does not parse"
        return
    overrides = collect_overrides(parsed, extra) if getattr(parsed, "takes_overrides",
                                                            False) else extra
    if parsed.command == "train" or getattr(parsed, "config_command", None) == "show":
        compose(overrides, parsed.config)
    else:
        assert not overrides, f"graft {' '.join(args)}: unrecognized {overrides}"


def shell_env() -> dict[str, str]:
    """This environment without GRAFT_* switches, this venv's scripts (``graft``) first on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRAFT_")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def run_page(page: str, folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Use ``page``'s blocks in order in ``folder``, as the module's docstring says."""
    shutil.copytree(REPO / "examples", folder / "examples")
    monkeypatch.chdir(folder)
    for marker, argument, lang, body in blocks(page):
        where = f"docs/{page}, block {body.splitlines()[0][:80]!r}"
        if marker == "file":
            (folder / argument).parent.mkdir(parents=True, exist_ok=True)
            (folder / argument).write_text(body)
        elif marker == "check":
            for line in body.splitlines():
                for args in graft_commands(line):
                    check_graft_command(args)
        elif marker == "own-data-commands":
            continue
        elif lang == "python":
            done = subprocess.run([sys.executable, "-c", body], cwd=folder, env=shell_env(),
                                  capture_output=True, text=True, timeout=600)
            assert done.returncode == 0, f"{where}\n{done.stdout[-2000:]}{done.stderr[-3000:]}"
        else:
            for line in body.splitlines():
                done = subprocess.run(line, shell=True, cwd=folder, env=shell_env(),
                                      capture_output=True, text=True, timeout=600)
                code, text = (argument.split(": ", 1) + [""])[:2] if marker == "exit" else (0, "")
                assert done.returncode == int(code), (
                    f"{where}: {line}\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
                assert text in done.stderr, f"{where}: no {text!r} in\n{done.stderr[-3000:]}"


@pytest.mark.parametrize("page", [pytest.param(page, marks=[pytest.mark.slow] * (page in SLOW))
                                  for page in PAGES])
def test_the_page_runs(page: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_page(page, tmp_path, monkeypatch)


def test_a_check_block_fails_on_an_unknown_key() -> None:
    from graft.errors import ConfigError

    with pytest.raises(ConfigError, match="total_step"):
        for args in graft_commands("graft train --nproc 8 --nnodes 2 trainer.total_step=3"):
            check_graft_command(args)


def test_the_readme_tour_composes() -> None:
    """The README's tour (its fourth bash block; the first three are CI's, tests/test_repository.py)
    names only valid keys, values and files."""
    blocks = re.findall(r"```bash\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    assert len(blocks) == 4, "the README's bash blocks: install and run, two test legs, the tour"
    for line in blocks[3].splitlines():
        for args in graft_commands(line):
            check_graft_command(args)


def test_the_configuration_reference_is_current() -> None:
    done = subprocess.run([sys.executable, str(DOCS / "reference" / "generate.py"), "--check"],
                          capture_output=True, text=True, timeout=300, env=shell_env())
    assert done.returncode == 0, done.stderr + done.stdout


# Plugin keys without a comment above their field (their plugins' config.py): only shrinks.
UNDESCRIBED = {"features.dapo.overlong_penalty", "features.lora.enabled",
               "features.multiturn.max_episode_tokens", "features.multiturn.env_timeout_s"}


def test_every_key_of_the_reference_has_a_description() -> None:
    rows = (DOCS / "reference" / "config.md").read_text().splitlines()
    undescribed = {row.split("`")[1] for row in rows if row.startswith("| `")
                   and row.endswith("|  |")}
    assert undescribed == UNDESCRIBED, (
        "a config key needs a comment above its field (what it does, its units); fixed ones "
        f"leave UNDESCRIBED: {sorted(undescribed ^ UNDESCRIBED)}")


def test_the_site_builds_with_warnings_as_errors(tmp_path: Path) -> None:
    """mkdocs is in both requirements files: a missing mkdocs fails here, it does not skip."""
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(tmp_path / "site")], cwd=REPO, capture_output=True, text=True,
                          timeout=600, env={**shell_env(), "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-5000:]
    assert (tmp_path / "site" / "reference" / "config" / "index.html").is_file()
