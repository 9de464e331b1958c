"""A reward worker (graft-reward-pool's) that cannot import a module the reward needs names it
and the pip command, never as a broken pipe; a worker process that ends on a sample fails that
sample only (moved from tests/core/plugins/test_missing_dependency.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from graft.config import compose
from graft.data.tasks import TextSample
from graft.errors import PluginError
from graft.rl import RewardFunction
from graft_reward_pool import RewardPool

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
