"""A real tiny run for the ``graft export`` and ``graft ckpt`` tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

# The umask the run and the exports of these tests are made under: not the usual 022, so a mode
# that is right only by chance (a hard-coded 0o644) is caught.
UMASK = 0o027


# The plugin selection passes on, so the run's config holds the sections the in-process
# `graft_cli` will load; a developer's other switches (tracing, debug) do not.
PLUGIN_SELECTION = ("GRAFT_PLUGINS", "GRAFT_DISABLE_PLUGINS")


def _graft(args: list[str], *, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("GRAFT_") or k in PLUGIN_SELECTION}
    return subprocess.run([sys.executable, "-m", "graft", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, umask=UMASK, timeout=300)


@pytest.fixture
def graft_cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
              ) -> Callable[..., subprocess.CompletedProcess[str]]:
    """``graft ARGS`` in this process (`graft.cli.main.main`), in ``cwd`` and under the umask
    `UMASK`; its exit code and output as a `CompletedProcess`."""
    from graft.cli.main import main

    def run(args: list[str], *, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        capsys.readouterr()
        with monkeypatch.context() as scoped:
            if cwd is not None:
                scoped.chdir(cwd)
            previous = os.umask(UMASK)
            try:
                code = main(args)
            except SystemExit as exit_:  # argparse's usage errors and --help
                code = exit_.code if isinstance(exit_.code, int) else 1
            finally:
                os.umask(previous)
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(["graft", *args], code, out, err)

    return run


@pytest.fixture
def umask() -> int:
    """The umask of `graft_cli` and `tiny_run`."""
    return UMASK


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished one-step tiny-llama SFT run made under `UMASK`: ``checkpoints/step_1`` and
    the end-of-run ``hf/``. Tests that change it use `run_copy`."""
    run = tmp_path_factory.mktemp("tiny-run") / "run"
    result = _graft(["train", f"trainer.run_dir={run}", "trainer.mode=sft",
                     "model.preset=tiny-llama", "trainer.total_steps=1"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert (run / "checkpoints" / "step_1" / ".metadata").is_file() and (run / "hf").is_dir()
    return run


@pytest.fixture
def run_copy(tiny_run: Path, tmp_path: Path) -> Path:
    """A copy of `tiny_run` in this test's tmp_path (modes kept)."""
    shutil.copytree(tiny_run, tmp_path / "run")
    return tmp_path / "run"
