"""The reward pool: threads or processes, results in order, a stuck sample scores 0 after the
time limit without stalling the batch (a stuck process is killed and replaced), errors reach
the caller, and a process runs rewards in its main thread (signals work there)."""

from __future__ import annotations

import re

import pytest

from graft.config import compose
from graft.data.tasks import TextSample, exact_match_reward
from graft.errors import DataError, PluginError
from graft.rl import RewardFunction
from graft_reward_pool import RewardPool

# A module the worker processes can import (they get this process's sys.path).
REWARDS = '''
import signal, threading, time


def stuck(response, sample):
    """Never returns for "stuck"; signals still interrupt it (as math-verify's do)."""
    if response == "stuck":
        while True:
            time.sleep(0.05)
    return float(len(response))


def blocked(response):
    """Blocks forever for "stuck" (in C: no signal, no bytecode boundary reaches it)."""
    if response == "stuck":
        threading.Event().wait()
    return 1.0


def alarm_in_main_thread(response):
    """What math-verify does: signal.alarm, which only a main thread may set."""
    signal.signal(signal.SIGALRM, lambda *_: None)
    signal.alarm(5)
    signal.alarm(0)
    return 1.0


def bad_data(response, sample):
    from graft.errors import DataError
    raise DataError(f"{sample.origin}: no ground truth")


def crash(response):
    raise ZeroDivisionError("a plugin bug")
'''


@pytest.fixture
def rewards_module(source_module):
    return source_module("pool_rewards", REWARDS)


@pytest.fixture
def pool():
    made = []

    def make(kind: str, *, workers: int = 2, timeout_s: float = 10.0) -> RewardPool:
        made.append(RewardPool(kind, workers=workers, timeout_s=timeout_s, cfg=compose([])))
        return made[-1]

    yield make
    for each in made:
        each.close()


def tasks(fn, responses, answer="ab"):
    reward = RewardFunction(fn)
    return [(reward, r, TextSample("p", "", answer, origin=f"f.jsonl, line {i + 1}"))
            for i, r in enumerate(responses)]


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_scores_come_back_in_order(pool, kind: str) -> None:
    result = pool(kind, workers=3).score(tasks(exact_match_reward, ["ab", "x", " ab ", "b"] * 3))
    assert result.scores == [1.0, 0.0, 1.0, 0.0] * 3 and result.timed_out == []


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["thread", "process"])
def test_a_stuck_sample_scores_zero_and_the_batch_goes_on(pool, rewards_module,
                                                          kind: str) -> None:
    fn = rewards_module.blocked if kind == "thread" else rewards_module.stuck
    workers = pool(kind, workers=1, timeout_s=3.0)
    result = workers.score(tasks(fn, ["a", "stuck", "b", "c"]))
    # one worker: the samples after the stuck one ran on its replacement
    assert result.timed_out == [1] and result.scores == [1.0, 0.0, 1.0, 1.0]
    assert workers.score(tasks(fn, ["d", "e"])).scores == [1.0, 1.0]


def test_a_killed_process_is_replaced(pool, rewards_module) -> None:
    workers = pool("process", workers=1, timeout_s=3.0)
    workers.score(tasks(rewards_module.stuck, ["a"]))
    first = workers.workers[0].process
    assert first.poll() is None  # a finished sample leaves its worker running
    assert workers.score(tasks(rewards_module.stuck, ["stuck"])).timed_out == [0]
    assert first.wait(timeout=30) == -9 and workers.workers == []  # killed, not kept
    assert workers.score(tasks(rewards_module.stuck, ["abc"])).scores == [3.0]
    assert workers.workers[0].process is not first


def test_processes_run_rewards_in_their_main_thread(pool, rewards_module) -> None:
    assert pool("process").score(tasks(rewards_module.alarm_in_main_thread, ["a"])).scores == [1.0]
    failure = pool("thread").score(tasks(rewards_module.alarm_in_main_thread, ["a"])).failures[0]
    assert "signal only works in main thread" in failure.detail


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_a_rewards_data_error_reaches_the_caller_as_it_is(pool, rewards_module, kind) -> None:
    with pytest.raises(DataError, match=r"^f.jsonl, line 2: no ground truth$"):
        pool(kind).score(tasks(rewards_module.bad_data, ["a", "b"])[1:])


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_a_reward_bug_is_a_failure_of_its_sample_and_the_batch_goes_on(pool, rewards_module,
                                                                         kind) -> None:
    result = pool(kind).score(tasks(rewards_module.crash, ["a", "b"]))
    assert result.scores == [0.0, 0.0] and sorted(result.failures) == [0, 1]
    message = result.failures[0].describe("pool_rewards.crash", "f.jsonl, line 1")
    assert re.fullmatch(r"the reward pool_rewards.crash failed on f.jsonl, line 1: "
                        r'ZeroDivisionError: a plugin bug \(".*pool_rewards.py", line \d+, '
                        r"in crash\)", message), message


def test_a_process_reward_must_pickle(pool) -> None:
    with pytest.raises(PluginError, match=r"runs in worker processes "
                                          r"\(features.reward_pool.kind\) but cannot be sent to "
                                          r"one .*features.reward_pool.kind=thread"):
        pool("process").score(tasks(lambda response: 1.0, ["a"]))


def test_a_reward_that_returns_no_number_is_named(pool) -> None:
    failure = pool("thread").score(tasks(lambda response: "yes", ["a"])).failures[0]
    assert failure.describe("r", "f.jsonl, line 1") == ("the reward r returned 'yes' for "
                                                        "f.jsonl, line 1; a reward returns a "
                                                        "finite number")
