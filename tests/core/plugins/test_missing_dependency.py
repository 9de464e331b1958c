"""A plugin whose declared dependency is not installed (a real distribution installed with
--no-deps): `graft plugins` reports it as failed with the pip command, instead of `loaded`; a
reward worker process that cannot import a module names it, never as a broken pipe."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from graft.config import compose
from graft.data.tasks import TextSample
from graft.errors import PluginError
from graft.plugins import GraftPluginManager
from graft.rl.reward_pool import RewardPool
from graft.rl.rewards import RewardFunction

PIP = "pip install 'graft-absent-dependency>=1.0'"


def test_graft_plugins_lists_the_missing_dependency_and_the_pip_command(
        run_graft, plugin_sites: dict[str, Path], clean_env: None) -> None:
    done = run_graft(["plugins", "--json"], site=plugin_sites["needs_dep"])
    assert done.returncode == 0, done.stderr
    (row,) = [r for r in json.loads(done.stdout) if r["name"] == "needs_dep"]
    assert row["status"] == "failed"
    assert row["error"] == ("missing dependency: graft-needs-dep-plugin 0.0.1 requires "
                            "graft-absent-dependency>=1.0, which is not installed (installed "
                            f"with --no-deps?); install it: {PIP}")
    assert "graft-absent-accelerator" not in row["error"]  # an extra's: not required
    table = run_graft(["plugins"], site=plugin_sites["needs_dep"], env={"COLUMNS": "300"})
    assert "failed: missing dependency" in table.stdout and PIP in table.stdout


def test_asking_for_its_reward_names_the_dependency(run_graft, plugin_sites: dict[str, Path],
                                                    clean_env: None) -> None:
    done = run_graft(["train", "algorithm.reward=needs_dep"], site=plugin_sites["needs_dep"])
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "plugin 'needs_dep'" in done.stderr and PIP in done.stderr
    requested = run_graft(["plugins"], site=plugin_sites["needs_dep"],
                          env={"GRAFT_PLUGINS": "needs_dep"})
    assert requested.returncode == 2 and PIP in requested.stderr, requested.stderr


def test_a_version_outside_the_declared_range_is_a_warning(plugin_sites: dict[str, Path],
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           tmp_path: Path, clean_env: None) -> None:
    # the same distribution, with a dependency that is installed but too old
    site = tmp_path / "site"
    site.mkdir()
    for entry in plugin_sites["needs_dep"].iterdir():
        if not entry.name.endswith(".dist-info"):
            (site / entry.name).symlink_to(entry)
            continue
        (site / entry.name).mkdir()
        for file in entry.iterdir():
            text = file.read_text().replace("graft-absent-dependency>=1.0", "pluggy>=999")
            (site / entry.name / file.name).write_text(text)
    monkeypatch.syspath_prepend(str(site))
    manager = GraftPluginManager()
    manager.load()
    record = manager.records["needs_dep"]
    assert record.status == "loaded"
    assert record.warnings and "graft-needs-dep-plugin requires pluggy>=999 (" in record.warnings[0]


# Rewards the worker processes import by name (they get this process's sys.path).
REWARDS = '''
import os


def needs_absent_module(response):
    import graft_absent_module  # noqa: F401

    return 1.0


def ends_its_process(response):
    if response == "exit":
        os._exit(3)
    return 1.0
'''

AT_IMPORT = '''
import graft_absent_at_import  # noqa: F401  (the worker imports it to unpickle the reward)


def needs(response):
    return 1.0
'''


@pytest.fixture
def worker_rewards(source_module):
    return source_module("worker_rewards", REWARDS)


def _tasks(reward: RewardFunction, responses=("a", "b")) -> list[tuple]:
    return [(reward, r, TextSample("p", "", "a", origin=f"f.jsonl, line {i + 1}"))
            for i, r in enumerate(responses)]


@pytest.fixture
def pool():
    made = []

    def make(kind: str = "process") -> RewardPool:
        made.append(RewardPool(kind, workers=2, timeout_s=30.0, cfg=compose([])))
        return made[-1]

    yield make
    for each in made:
        each.close()


@pytest.mark.parametrize("kind", ["process", "thread"])
def test_a_worker_that_cannot_preload_names_the_module(pool, worker_rewards, kind: str) -> None:
    reward = RewardFunction(worker_rewards.needs_absent_module, preload=("graft_absent_module",))
    with pytest.raises(PluginError) as caught:
        pool(kind).score(_tasks(reward))
    message = str(caught.value)
    assert message.startswith(f"a reward worker ({kind}) could not import the module "
                              f"'graft_absent_module', which the reward "
                              f"worker_rewards.needs_absent_module needs")
    assert "No module named 'graft_absent_module'" in message
    assert "pip install graft-absent-module, if that is its name" in message


def test_a_worker_that_cannot_import_the_rewards_module_names_it(pool, tmp_path: Path,
                                                                  monkeypatch) -> None:
    # The module imports here (its dependency is a stand-in on this process's path), not in
    # the workers, which start after the stand-in left the path.
    (tmp_path / "needs_at_import.py").write_text(AT_IMPORT)
    stand_in = tmp_path / "stand_in"
    stand_in.mkdir()
    (stand_in / "graft_absent_at_import.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(stand_in))
    import needs_at_import

    sys.path.remove(str(stand_in))
    try:
        with pytest.raises(PluginError, match=r"could not import the module "
                                              r"'graft_absent_at_import'"):
            pool().score(_tasks(RewardFunction(needs_at_import.needs)))
    finally:
        sys.modules.pop("needs_at_import", None)
        sys.modules.pop("graft_absent_at_import", None)


def test_a_worker_that_dies_on_a_sample_fails_that_sample_only(pool, worker_rewards) -> None:
    tasks = _tasks(RewardFunction(worker_rewards.ends_its_process), ["a", "exit", "b", "c"])
    workers = pool()
    result = workers.score(tasks)
    assert result.scores == [1.0, 0.0, 1.0, 1.0] and list(result.failures) == [1]
    assert result.failures[1].describe("r", "f.jsonl, line 2") == (
        "the reward r ended its worker process on f.jsonl, line 2 (exit code 3)")
    assert workers.score(tasks[:1]).scores == [1.0]  # a new worker took its place
