"""``graft_reward_executor``: a plugin's executor runs the scorer's rewards (started with the
dataset's rewards, its scores and metrics the scorer's, its failures under
``algorithm.reward_errors``); without one the core calls each reward in the calling thread, in
order, without a time limit (an in-test executor; no graft-reward-pool)."""

from __future__ import annotations

import threading

import pytest

from graft import hookimpl
from graft.config import compose
from graft.data.tasks import TextSample
from graft.errors import DataError, PluginError
from graft.plugins import GraftPluginManager
from graft.rl import (
    InlineRewards,
    RewardBatchResult,
    RewardExecutor,
    RewardFailure,
    RewardFunction,
)
from graft.rl.rewards import RewardScorer

SAMPLES = [TextSample("p", "", "a", origin=f"d.jsonl, line {i + 1}") for i in range(3)]


class Recording:
    """An executor that scores every task 0.5 (or fails the response "bad") and records what the
    scorer asked of it."""

    def __init__(self) -> None:
        self.started: list[object] = []
        self.batches: list[list[str]] = []
        self.closed = False

    def start(self, rewards):
        self.started = list(rewards)

    def score(self, tasks):
        self.batches.append([response for _, response, _ in tasks])
        failures = {i: RewardFailure("value", "'no'") for i, (_, response, _) in enumerate(tasks)
                    if response == "bad"}
        return RewardBatchResult([0.0 if i in failures else 0.5 for i in range(len(tasks))],
                                 failures)

    def metrics(self):
        return {"mine/batches": float(len(self.batches))}

    def close(self):
        self.closed = True


class Plugin:
    def __init__(self) -> None:
        self.executor = Recording()
        self.seen: list[str] = []

    @hookimpl
    def graft_reward_executor(self, cfg):
        self.seen.append(cfg.algorithm.reward)
        return self.executor


def test_hook_graft_reward_executor_runs_the_scorers_rewards(graft_plugin) -> None:
    plugin = Plugin()
    graft_plugin(plugin, name="recording")
    scorer = RewardScorer(SAMPLES, cfg=compose(["data.source=file"]))
    executor = plugin.executor
    assert plugin.seen == ["auto"] and isinstance(executor, RewardExecutor)
    assert [reward.fn.__name__ for reward in executor.started] == ["exact_match_reward"]
    assert scorer.score(["a", "b", "c"], SAMPLES) == [0.5, 0.5, 0.5]
    assert executor.batches == [["a", "b", "c"]]
    assert scorer.metrics() == {"mine/batches": 1.0, "reward_errors": 0.0}
    with pytest.raises(PluginError, match=r"^the reward 'exact_match' \(.*exact_match_reward\) "
                                          r"returned 'no' for d.jsonl, line 2; a reward returns a "
                                          r"finite number"):
        scorer.score(["a", "bad", "c"], SAMPLES)
    scorer.close()
    assert executor.closed


def test_without_an_executor_the_rewards_run_in_the_calling_thread_in_order() -> None:
    calls: list[tuple[str, bool]] = []

    def recorded(response: str) -> float:
        calls.append((response, threading.current_thread() is threading.main_thread()))
        return float(len(response))

    class Rewards:
        @hookimpl
        def graft_reward_functions(self):
            return {"recorded": recorded}

    manager = GraftPluginManager()
    manager.load(candidates=[])  # the core alone (GRAFT_PLUGINS=)
    manager.register(Rewards(), "rewards")
    cfg = compose(["data.source=file", "algorithm.reward=recorded"], manager=manager)
    scorer = RewardScorer(SAMPLES, manager, cfg=cfg)
    assert isinstance(scorer.executor, InlineRewards)
    assert scorer.score(["ccc", "a", "bb"], SAMPLES) == [3.0, 1.0, 2.0]
    assert calls == [("ccc", True), ("a", True), ("bb", True)]
    assert scorer.metrics() == {"reward_errors": 0.0}  # no time limit, so no reward_timeouts
    scorer.close()


def test_the_inline_executor_returns_a_failure_and_raises_graft_errors() -> None:
    def reward(response: str) -> float:
        if response == "data":
            raise DataError("no ground truth")
        if response == "raise":
            return 1 / 0
        return float("nan") if response == "nan" else 1.0

    inline = InlineRewards(cfg=compose([]))
    tasks = [(RewardFunction(reward), r, SAMPLES[0]) for r in ("ok", "nan", "raise")]
    result = inline.score(tasks)
    assert result.scores == [1.0, 0.0, 0.0] and sorted(result.failures) == [1, 2]
    assert result.failures[1] == RewardFailure("value", "nan", result.failures[1].trace)
    assert result.failures[2].detail.startswith("ZeroDivisionError: division by zero (")
    with pytest.raises(DataError, match="no ground truth"):
        inline.score([(RewardFunction(reward), "data", SAMPLES[0])])
