"""The installed plugin through Graft: graft.testing's conformance check, its section and its
bounds, the old ``algorithm.*`` keys refused with the new ones named, the scorer's rewards run
in its pools (``reward_timeouts`` next to the core's ``reward_errors``, in an RL step's metrics
too), a failing reward under ``algorithm.reward_errors`` in threads and in processes, and a
sample past ``features.reward_pool.timeout_s`` scored 0 with a warning."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

import graft
from graft import hookimpl
from graft.config import compose
from graft.data.tasks import TextSample
from graft.errors import ConfigError
from graft.rl import RewardFunction
from graft.rl.rewards import RewardScorer
from graft.testing import check_config_section, check_installed_plugin, check_moved_key
from graft_reward_pool import PoolExecutor, RewardPoolConfig

SAMPLES = [TextSample("p", "", "a", origin=f"d.jsonl, line {i + 1}") for i in range(4)]
# Rewards the worker processes import by name (they get this process's sys.path).
REWARDS = '''
import threading

RELEASE = threading.Event()


def nan(response):
    return float("nan") if response == "bad" else 1.0


def blocked(response):
    """Blocks for "stuck" until the test releases it (a thread cannot be stopped)."""
    if response == "stuck":
        RELEASE.wait()
    return 1.0
'''


@pytest.fixture
def rewards(source_module, graft_plugin):
    """Registers the rewards ``nan`` and ``blocked`` of a module the workers can import."""
    module = source_module("pool_plugin_rewards", REWARDS)

    def register(pool: str = "thread") -> None:
        class Rewards:
            @hookimpl
            def graft_reward_functions(self):
                return {name: RewardFunction(getattr(module, name), pool=pool)
                        for name in ("nan", "blocked")}

        graft_plugin(Rewards(), name="pool-plugin-rewards")

    yield register
    module.RELEASE.set()


def test_the_installed_plugin_passes_graft_testing() -> None:
    assert set(check_installed_plugin("reward_pool")) == {"graft_config_sections",
                                                          "graft_reward_executor"}
    assert check_config_section("reward_pool", RewardPoolConfig) == {
        "kind": "auto", "workers": 4, "timeout_s": 10.0}


@pytest.mark.parametrize("old, new, value", [
    ("algorithm.reward_workers", "features.reward_pool.workers", "8"),
    ("algorithm.reward_pool", "features.reward_pool.kind", "process"),
    ("algorithm.reward_timeout_s", "features.reward_pool.timeout_s", "30")])
def test_an_old_algorithm_key_names_its_new_home(old: str, new: str, value: str,
                                                 tmp_path: Path) -> None:
    check_moved_key(old, new, value, tmp_path)


def test_a_saved_config_with_the_old_defaults_still_composes(tmp_path: Path) -> None:
    """A config.yaml of an earlier version lists every key at its default."""
    (tmp_path / "config.yaml").write_text("algorithm:\n  reward_workers: 4\n  reward_pool: auto\n"
                                          "  reward_timeout_s: 10.0\n")
    cfg = graft.compose(config_files=[tmp_path / "config.yaml"])
    assert cfg.features.reward_pool == RewardPoolConfig()


@pytest.mark.parametrize("override", ["features.reward_pool.workers=0",
                                      "features.reward_pool.timeout_s=0",
                                      "features.reward_pool.kind=fork"])
def test_the_section_keeps_the_old_bounds(override: str) -> None:
    with pytest.raises(ConfigError, match=override.split("=")[0].replace(".", r"\.")):
        compose([override])


@pytest.mark.parametrize("pool", ["thread", "process"])
def test_zero_counts_the_failures_and_the_pool_its_timeouts(rewards, pool: str) -> None:
    rewards(pool)
    scorer = RewardScorer(cfg=compose(["data.source=file", "algorithm.reward=nan",
                                       "algorithm.reward_errors=zero",
                                       "features.reward_pool.workers=2"]))
    try:
        assert isinstance(scorer.executor, PoolExecutor)
        assert scorer.score(["ok", "ok", "bad", "bad"], SAMPLES) == [1.0, 1.0, 0.0, 0.0]
        assert scorer.metrics() == {"reward_timeouts": 0.0, "reward_errors": 2.0}
    finally:
        scorer.close()


def test_a_sample_past_the_time_limit_scores_zero_with_a_warning(
        rewards, caplog: pytest.LogCaptureFixture) -> None:
    rewards("thread")
    scorer = RewardScorer(cfg=compose(["data.source=file", "algorithm.reward=blocked",
                                       "features.reward_pool.timeout_s=1"]))
    try:
        assert scorer.score(["a", "stuck", "b", "c"], SAMPLES) == [1.0, 0.0, 1.0, 1.0]
        assert scorer.metrics() == {"reward_timeouts": 1.0, "reward_errors": 0.0}
        assert scorer.score(["a"], SAMPLES[:1]) == [1.0]
        assert scorer.metrics()["reward_timeouts"] == 0.0  # per call
    finally:
        scorer.close()
    assert ("the reward of d.jsonl, line 2 took longer than features.reward_pool.timeout_s=1.0 "
            "and scores 0") in caplog.text


def test_an_rl_step_reports_the_pools_timeouts(graft_plugin, tmp_path: Path) -> None:
    threads = []

    def where(response: str) -> float:
        threads.append(threading.current_thread().name)
        return 1.0

    class Where:
        @hookimpl
        def graft_reward_functions(self):
            return {"where": where}

    graft_plugin(Where(), name="where")
    from graft.training.trainer import Trainer

    cfg = compose([f"trainer.run_dir={tmp_path / 'run'}", "trainer.total_steps=1",
                   "engine.device=cpu", "model.preset=tiny-llama", "algorithm.reward=where",
                   "rollout.prompts_per_step=2", "rollout.n=2", "rollout.max_new_tokens=3",
                   "checkpoint.save_at_end=false", "export.hf_at_end=false",
                   "trainer.val_every_steps=0"])
    (metrics,) = Trainer(cfg).fit()
    assert metrics["reward_timeouts"] == 0.0 and metrics["reward_errors"] == 0.0
    assert len(threads) == 4 and set(threads) == {"graft-reward"}  # the pool's threads
