"""A reward that raises or returns no finite number (NaN, inf, a string): algorithm.reward_errors=
stop (the default) stops the run naming the reward and the sample, without a traceback; zero
scores the sample 0 and counts it (reward_errors). A non-finite value never reaches the update."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from graft import hookimpl
from graft.config import compose
from graft.data.tasks import TextSample
from graft.errors import ConfigError, PluginError
from graft.rl import RewardFunction
from graft.rl.rewards import RewardScorer

# A process reward must be importable by name in an executor's workers (graft-reward-pool's,
# when installed): this module's functions are written to a file on the workers' path
# (`faulty_module`). Without such a plugin every reward runs in this thread.
FAULTY = '''
def nan(response):
    return float("nan") if response == "bad" else 1.0


def inf(response):
    return float("-inf") if response == "bad" else 1.0


def text(response):
    return "yes" if response == "bad" else 1.0


def raises(response):
    if response == "bad":
        raise KeyError("missing")
    return 1.0
'''


@pytest.fixture
def faulty(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, graft_plugin):
    """Registers the rewards nan, inf, text and raises (1.0, except for the response "bad")."""
    (tmp_path / "faulty_module.py").write_text(FAULTY)
    monkeypatch.syspath_prepend(str(tmp_path))
    import faulty_module

    def rewards(pool: str) -> None:
        class Faulty:
            @hookimpl
            def graft_reward_functions(self):
                return {name: RewardFunction(getattr(faulty_module, name), pool=pool)
                        for name in ("nan", "inf", "text", "raises")}

        graft_plugin(Faulty(), name="faulty")

    yield rewards
    sys.modules.pop("faulty_module", None)


def scorer(name: str, *overrides: str) -> RewardScorer:
    return RewardScorer(cfg=compose(["data.source=file", f"algorithm.reward={name}",
                                     *overrides]))


SAMPLES = [TextSample("p", "", "a", origin=f"d.jsonl, line {i + 1}") for i in range(4)]
RESPONSES = ["ok", "ok", "bad", "bad"]
WHAT = {"nan": "returned nan for d.jsonl, line 3; a reward returns a finite number",
        "inf": "returned -inf for d.jsonl, line 3; a reward returns a finite number",
        "text": "returned 'yes' for d.jsonl, line 3; a reward returns a finite number",
        "raises": "failed on d.jsonl, line 3: KeyError: 'missing' ("}


@pytest.mark.parametrize("pool", ["thread", "process"])
@pytest.mark.parametrize("name", ["nan", "inf", "text", "raises"])
def test_stop_names_the_reward_and_the_sample(faulty, pool: str, name: str) -> None:
    faulty(pool)
    rewards = scorer(name)
    try:
        with pytest.raises(PluginError) as caught:
            rewards.score(RESPONSES, SAMPLES)
    finally:
        rewards.close()
    message = str(caught.value)
    assert message.startswith(f"the reward {name!r} (faulty_module.{name}) {WHAT[name]}")
    assert message.endswith("Fix the reward, or set algorithm.reward_errors=zero to score a "
                            "failing sample 0 and count it (metric reward_errors)")
    assert "Traceback" not in message


@pytest.mark.parametrize("name", ["nan", "raises"])
def test_zero_scores_the_sample_zero_and_counts_it(faulty, name: str,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    faulty("thread")
    rewards = scorer(name, "algorithm.reward_errors=zero")
    try:
        assert rewards.score(RESPONSES, SAMPLES) == [1.0, 1.0, 0.0, 0.0]
        assert rewards.metrics()["reward_errors"] == 2.0  # with graft-reward-pool: its counts
        assert rewards.score(RESPONSES[:2], SAMPLES[:2]) == [1.0, 1.0]
        assert rewards.metrics()["reward_errors"] == 0.0  # per call
    finally:
        rewards.close()
    assert (f"2 of 4 rewards failed and score 0 (algorithm.reward_errors=zero); the first: the "
            f"reward {name!r} (faulty_module.{name}) {WHAT[name]}") in caplog.text


def test_reward_errors_takes_stop_or_zero() -> None:
    assert compose([]).algorithm.reward_errors == "stop"
    with pytest.raises(ConfigError, match=r"algorithm.reward_errors"):
        compose(["algorithm.reward_errors=skip"])


def _data(tmp_path: Path) -> Path:
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"say {i}:", "answer": str(i)}) + "\n"
                            for i in range(4)))
    return data


RUN = ("trainer.total_steps=1", "model.preset=tiny-llama", "data.source=file",
       "rollout.prompts_per_step=2", "rollout.n=2", "rollout.max_new_tokens=3",
       "checkpoint.save_at_end=false", "export.hf_at_end=false", "trainer.val_every_steps=0")


@pytest.mark.slow  # a graft train process (~20 s on 2 cores)
def test_graft_train_stops_on_a_failing_reward_with_a_message(
        run_graft, plugin_sites: dict[str, Path], tmp_path: Path, clean_env: None) -> None:
    done = run_graft(["train", f"trainer.run_dir={tmp_path / 'run'}", f"data.path="
                      f"{_data(tmp_path)}", "algorithm.reward=raising_reward", *RUN],
                     site=plugin_sites["faulty_rewards"])
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
    assert ("graft: error: the reward 'raising_reward' (graft_faulty_rewards.plugin."
            "raising_reward) failed on ") in done.stderr
    assert "d.jsonl, line " in done.stderr and "ZeroDivisionError: division by zero" in done.stderr


@pytest.mark.slow  # a graft train process (~20 s on 2 cores)
def test_graft_train_with_zero_trains_on_finite_rewards_and_counts_the_nans(
        run_graft, plugin_sites: dict[str, Path], tmp_path: Path, clean_env: None) -> None:
    run = tmp_path / "run"
    done = run_graft(["train", f"trainer.run_dir={run}", f"data.path={_data(tmp_path)}",
                      "algorithm.reward=nan_reward", "algorithm.reward_errors=zero", *RUN],
                     site=plugin_sites["faulty_rewards"])
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert row["reward_errors"] == 4.0 and row["reward_mean"] == 0.0
    assert math.isfinite(row["loss"]) and math.isfinite(row["grad_norm"])
    assert "4 of 4 rewards failed and score 0" in done.stderr
