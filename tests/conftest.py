"""Shared fixtures: real installs of the test plugin distributions, and a CLI runner."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
PLUGIN_SOURCES = REPO / "tests" / "plugins"

# Which test distributions each site holds; a site is a `pip install --target` folder that a
# test puts on sys.path / PYTHONPATH, so the plugins never land in the developer's environment.
SITES = {
    "good": ("graft_demo_plugin", "graft_broken_plugin"),
    "demo": ("graft_demo_plugin",),
    "duplicate": ("graft_demo_plugin", "graft_demo_twin"),
    "typo": ("graft_typo_plugin",),
    "moe_ep": ("graft_moe_ep_plugin",),
    "meta_blind": ("graft_meta_blind_plugin",),
    "offload_standin": ("graft_offload_standin_plugin",),
    "needs_dep": ("graft_needs_dep_plugin",),
    "faulty_rewards": ("graft_faulty_rewards_plugin",),
    "roles": ("graft_roles_plugin",),
}

ENV_KEYS = ("GRAFT_PLUGINS", "GRAFT_DISABLE_PLUGINS", "GRAFT_TRACE_PLUGINS", "GRAFT_DEBUG")

# Tests of code that differs between transformers versions (the KV-cache keyword renamed in
# 5.24, checkpointing moved into the layer's forward in 5.23, fp32 parameters kept in 5.24, the
# default runs' committed metrics): marked `transformers_versions`, so CI runs them on the oldest
# tested transformers (README command 2, with vLLM) as well as on the newest (command 3, with
# everything else). tests/test_repository.py checks that each file exists.
TRANSFORMERS_VERSIONS = (
    "tests/core/engine/distributed/test_activation_checkpointing.py",
    "tests/core/engine/distributed/test_dtype_units.py",
    "tests/core/models/test_kv_cache.py",
    "tests/core/training/test_reference_metrics.py",
    "tests/deepseek_v4/test_model_path.py",
    "tests/gpt_oss/test_family.py",
    "tests/graphed_decode/test_decoder.py",
    "tests/graphed_decode/test_regional_compile.py",
    "tests/offload/test_offloader.py",
    "tests/offload/test_patching.py",
    "tests/router_replay/test_recorder.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the tests of `TRANSFORMERS_VERSIONS`."""
    for item in items:
        if item.path.relative_to(REPO).as_posix() in TRANSFORMERS_VERSIONS:
            item.add_marker(pytest.mark.transformers_versions)


def _pip(*args: str | Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *map(str, args)],
                   check=True)


@pytest.fixture(scope="session")
def build_once(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, Callable[[Path], None]], Path]:
    """``build_once(name, build)``: the folder ``name``, filled by ``build(folder)`` once per
    test run and shared by pytest-xdist's workers (the first builds it while the others wait,
    then they read it), for fixtures whose setup launches multi-process runs or builds wheels,
    which every worker would otherwise repeat. A build that raised is tried again by the next."""
    from filelock import FileLock

    run = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        run = run.parent  # this run's folder; each worker's own is below it

    def build_folder(name: str, build: Callable[[Path], None]) -> Path:
        folder, built = run / name, run / f"{name}.built"
        with FileLock(run / f"{name}.lock"):
            if not built.exists():
                shutil.rmtree(folder, ignore_errors=True)  # a failed build of this run's
                folder.mkdir()
                build(folder)
                built.touch()
        return folder

    return build_folder


def _install_plugin_sites(root: Path) -> None:
    """Build the test plugin wheels and install them into one target folder per site."""
    sources = root / "src"
    shutil.copytree(PLUGIN_SOURCES, sources, ignore=shutil.ignore_patterns("*.egg-info", "build"))
    wheels = root / "wheels"
    _pip("wheel", "--no-deps", "--no-build-isolation", "-w", wheels,
         *(sources / name for name in sorted({n for names in SITES.values() for n in names})))
    for site, names in SITES.items():
        files = [next(wheels.glob(f"{name}-*.whl")) for name in names]
        _pip("install", "--no-deps", "--no-index", "--target", root / site, *files)


@pytest.fixture(scope="session")
def plugin_sites(build_once: Callable[[str, Callable[[Path], None]], Path]) -> dict[str, Path]:
    """The test plugin distributions installed, one target folder per site (`SITES`)."""
    root = build_once("plugin-sites", _install_plugin_sites)
    return {site: root / site for site in SITES}


@pytest.fixture(scope="session", autouse=True)
def compile_cache_in_a_temporary_folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Runs keep their torch.compile caches under ``$XDG_CACHE_HOME/graft`` (the user's cache):
    tests, and the runs they start, use a folder of the session's instead (one for all, so a
    test after another finds its compiled graphs)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
        patch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
        yield


@pytest.fixture(scope="session", autouse=True)
def process_plugins() -> None:
    """Load this process's plugins before any test puts a plugin site on sys.path, so the
    process-wide manager holds only what is really installed (tests register theirs)."""
    from graft.plugins import get_plugin_manager

    get_plugin_manager()


@pytest.fixture
def graft_train(run_graft) -> Callable[..., subprocess.CompletedProcess[str]]:
    """``graft train [--nproc N] trainer.run_dir=RUN_DIR ARGS`` that must succeed."""

    def train(run_dir: Path, *args: str, nproc: int = 1) -> subprocess.CompletedProcess[str]:
        command = ["train", *(["--nproc", str(nproc)] if nproc > 1 else []),
                   f"trainer.run_dir={run_dir}", *args]
        result = run_graft(command)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
        return result

    return train


def read_metrics(run_dir: Path) -> list[dict]:
    """The rows of ``<run_dir>/metrics.jsonl``."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def metrics_of() -> Callable[[Path], list[dict]]:
    """`read_metrics` for tests (conftest helpers are reached through fixtures)."""
    return read_metrics


def require(module: str, switch: str) -> None:
    """Skip without ``module``, except where the environment sets ``switch=1`` (CI): there it
    must be present."""
    try:
        importlib.import_module(module)
    except ImportError:
        if os.environ.get(switch) == "1":
            raise
        pytest.skip(f"{module} is not installed (CI installs it and sets {switch}=1)")


@pytest.fixture
def requires_vllm() -> None:
    """vLLM, required where ``GRAFT_REQUIRE_VLLM=1`` (CI's first leg)."""
    require("vllm", "GRAFT_REQUIRE_VLLM")


@pytest.fixture
def requires_triton() -> None:
    """Triton (its interpreter runs the kernels' tests on CPU), required where
    ``GRAFT_REQUIRE_TRITON=1`` (CI's second leg)."""
    require("triton", "GRAFT_REQUIRE_TRITON")


@pytest.fixture
def site_without(tmp_path: Path) -> Callable[[str], Path]:
    """``site_without(name)``: a folder to put first on ``PYTHONPATH`` (`run_graft`'s ``site``)
    where ``import name`` fails as it does when the package is not installed."""

    def make(name: str) -> Path:
        site = tmp_path / f"site-without-{name}"
        (site / name).mkdir(parents=True)
        (site / name / "__init__.py").write_text(
            f"raise ModuleNotFoundError(\"No module named '{name}'\", name='{name}')\n")
        return site

    return make


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Remove the GRAFT_* switches a developer may have set."""
    for key in ENV_KEYS:
        monkeypatch.delenv(key, raising=False)


@pytest.fixture
def run_graft() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run ``python -m graft ARGS`` in a subprocess with an optional plugin site on PYTHONPATH."""

    def run(args: Sequence[str], *, site: Path | None = None,
            env: dict[str, str] | None = None, cwd: Path | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess[str]:
        full_env = {k: v for k, v in os.environ.items() if k not in ENV_KEYS}
        if site is not None:
            full_env["PYTHONPATH"] = os.pathsep.join(
                [str(site), *filter(None, [full_env.get("PYTHONPATH")])])
        full_env.update(env or {})
        return subprocess.run([sys.executable, "-m", "graft", *args], capture_output=True,
                              text=True, env=full_env, cwd=cwd or REPO, timeout=timeout)

    return run


@pytest.fixture
def interpreted_ok(requires_triton: None) -> Callable[..., None]:
    """Run a script (``REPO``-relative path, with arguments) under Triton's CPU interpreter
    (``TRITON_INTERPRET=1``, in its own process: the interpreter is chosen when the kernels are
    defined) and assert it ends by printing OK; skips without Triton (`requires_triton`)."""

    def run(script: str, *args: str) -> None:
        done = subprocess.run([sys.executable, str(REPO / script), *args], capture_output=True,
                              text=True, timeout=300, env={**os.environ, "TRITON_INTERPRET": "1"})
        assert done.returncode == 0 and done.stdout.strip().endswith("OK"), done.stderr[-3000:]

    return run


@pytest.fixture
def source_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Any]]:
    """``source_module(name, source)``: the module ``name`` written from ``source`` into a
    temporary folder on ``sys.path`` and imported (reward functions that worker processes must
    import by name); forgotten again after the test."""
    import textwrap

    names = []

    def load(name: str, source: str) -> Any:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        monkeypatch.syspath_prepend(str(tmp_path))
        names.append(name)
        return importlib.import_module(name)

    yield load
    for name in names:
        sys.modules.pop(name, None)


@pytest.fixture(scope="module")
def trained_moe(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A `graft.training.trainer.Trainer` of a tiny Qwen3-MoE after one SFT step on CPU, for
    the export tests (the core's and graft-vllm's delta export); one per test module, which may
    train it further."""
    from graft.config import compose
    from graft.training.trainer import Trainer

    run_dir = tmp_path_factory.mktemp("export-run")
    cfg = compose([f"trainer.run_dir={run_dir}", "trainer.total_steps=1",
                   "model.preset=tiny-qwen3-moe", "engine.device=cpu", "optim.lr=1e-4",
                   "trainer.mode=sft",
                   "export.hf_at_end=false", "checkpoint.every_steps=0"])
    trainer = Trainer(cfg)
    trainer.fit()
    return trainer
