"""A small batch is spread over every worker of the reward pool: N samples on N workers run on N
workers, and samples that each run past the time limit time out together, not one after
another."""

from __future__ import annotations

import time

import pytest

from graft.config import compose
from graft.data.tasks import TextSample
from graft.rl import RewardFunction
from graft_reward_pool import RewardPool

# Rewards the worker processes import by name (they get this process's sys.path).
REWARDS = '''
import os
import threading
import time


def worker_id(response):
    """Which worker scored the sample (its process, or its thread in a thread pool)."""
    time.sleep(0.2)
    return float(os.getpid() * 100000 + threading.get_ident() % 100000)


def sleeps(response):
    """Sleeps far past any time limit of the tests (interruptible, in a process or a thread)."""
    time.sleep(60)
    return 1.0
'''


@pytest.fixture
def rewards(source_module):
    return source_module("spread_rewards", REWARDS)


@pytest.fixture
def pool():
    made = []

    def make(kind: str, *, workers: int, timeout_s: float = 30.0) -> RewardPool:
        made.append(RewardPool(kind, workers=workers, timeout_s=timeout_s, cfg=compose([])))
        return made[-1]

    yield make
    for each in made:
        each.close()


def tasks(fn, count: int) -> list[tuple]:
    return [(RewardFunction(fn), str(i), TextSample("p", "", "a", origin=f"f, line {i}"))
            for i in range(count)]


@pytest.mark.parametrize(("kind", "workers"), [("thread", 16), ("process", 6)])
def test_n_samples_on_n_workers_use_every_worker(pool, rewards, kind: str, workers: int) -> None:
    scores = pool(kind, workers=workers).score(tasks(rewards.worker_id, workers)).scores
    assert len(set(scores)) == workers


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_four_samples_past_the_limit_time_out_together(pool, rewards, kind: str) -> None:
    timeout_s = 2.0
    workers = pool(kind, workers=4, timeout_s=timeout_s)
    workers.start()
    workers.score(tasks(rewards.worker_id, 4))  # started and warm: only the samples are timed
    started = time.monotonic()
    result = workers.score(tasks(rewards.sleeps, 4))
    elapsed = time.monotonic() - started
    assert result.timed_out == [0, 1, 2, 3] and result.scores == [0.0] * 4
    # one after another they took 4 x 2 s
    assert elapsed < 2.5 * timeout_s, elapsed
