"""Environment failures on the console: a few lines per run and a count for the rest, the
traceback under GRAFT_DEBUG=1, a warning for a step whose every episode failed, and a stop
after ``features.multiturn.max_failed_env_steps`` such steps in a row (a tiny Llama on
CPU)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from graft_multiturn.episodes import SHOWN_FAILURES, EpisodeLimits, EpisodeRunner

from graft import hookimpl
from graft.config import compose
from graft.errors import PluginError
from graft.rollout import SamplingSpec
from graft.training.trainer import Trainer

RUN = ("engine.device=cpu", "model.preset=tiny-llama", "rollout.prompts_per_step=2",
       "rollout.n=2", "rollout.max_new_tokens=4", "checkpoint.every_steps=0",
       "checkpoint.save_at_end=false", "export.hf_at_end=false")


class Crashes:
    """A tool that raises in every step."""

    def reset(self, sample):
        return None

    def step(self, action_ids, action_text):
        return crash_in_the_tool(action_text)


def crash_in_the_tool(text: str):
    raise RuntimeError("tool crashed")


class Hangs(Crashes):
    def step(self, action_ids, action_text):
        time.sleep(2)  # a tool stuck here: the timeout's report shows this line
        return None, 1.0, True


class CrashesOnOddEpisodes(Crashes):
    """Half the episodes fail: the step is not one whose every episode failed."""

    built = 0

    def __init__(self) -> None:
        CrashesOnOddEpisodes.built += 1
        self.crashes = CrashesOnOddEpisodes.built % 2 == 1

    def step(self, action_ids, action_text):
        if self.crashes:
            crash_in_the_tool(action_text)
        return None, None, True


@pytest.fixture(scope="module")
def engine_and_tokenizer(tmp_path_factory: pytest.TempPathFactory):
    trainer = Trainer(compose([f"trainer.run_dir={tmp_path_factory.mktemp('failures')}", *RUN]))
    return trainer.job.rollout, trainer.tokenizer


def run_episodes(engine_and_tokenizer, factory, *, count: int, timeout_s: float = 5.0):
    engine, tokenizer = engine_and_tokenizer
    runner = EpisodeRunner(factory, tokenizer=tokenizer, limits=EpisodeLimits(2, 32, timeout_s))
    prompts = [tokenizer("say ab:", add_special_tokens=False)["input_ids"]] * count
    return runner, runner.run(engine, [None] * count, prompts, SamplingSpec(1.0, 1.0, 4))


def failure_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "graft.rollout"]


def test_a_run_logs_a_few_failed_episodes_and_counts_the_rest(engine_and_tokenizer, caplog,
                                                              monkeypatch) -> None:
    monkeypatch.delenv("GRAFT_DEBUG", raising=False)
    caplog.set_level(logging.INFO, logger="graft.rollout")
    _, batch = run_episodes(engine_and_tokenizer, Crashes, count=8)
    lines = failure_lines(caplog)
    shown = [line for line in lines if line.startswith("an episode of")]
    assert len(shown) == SHOWN_FAILURES == 3 and len(lines) == SHOWN_FAILURES + 1
    assert all("the environment raised RuntimeError: tool crashed" in line for line in shown)
    assert "GRAFT_DEBUG=1 shows where" in shown[0] and "Traceback" not in "".join(lines)
    assert lines[-1].startswith("5 more episodes ended with reward 0 (5 environment errors")
    assert batch.metrics["rollout/env_errors"] == 8.0
    assert batch.metrics["rollout/env_error_fraction"] == 1.0


def test_graft_debug_shows_the_traceback_of_what_raised(engine_and_tokenizer, caplog,
                                                        monkeypatch) -> None:
    monkeypatch.setenv("GRAFT_DEBUG", "1")
    caplog.set_level(logging.INFO, logger="graft.rollout")
    run_episodes(engine_and_tokenizer, Crashes, count=2)
    (first, second) = failure_lines(caplog)
    assert "Traceback (most recent call last)" in first and "in crash_in_the_tool" in first
    assert 'raise RuntimeError("tool crashed")' in first and first.count("\n") > 3


def test_graft_debug_shows_where_a_call_past_its_deadline_was(engine_and_tokenizer, caplog,
                                                              monkeypatch) -> None:
    monkeypatch.setenv("GRAFT_DEBUG", "1")
    caplog.set_level(logging.INFO, logger="graft.rollout")
    run_episodes(engine_and_tokenizer, Hangs, count=1, timeout_s=0.3)
    (line,) = failure_lines(caplog)
    assert "took longer than features.multiturn.env_timeout_s=0.3" in line
    assert "in step" in line and "time.sleep(2)" in line


class BrokenToolPlugin:
    @hookimpl
    def graft_environments(self):
        return {"crashes": Crashes, "crashes-half": CrashesOnOddEpisodes}


def fit(tmp_path: Path, *overrides: str) -> list[dict]:
    return Trainer(compose([f"trainer.run_dir={tmp_path}", *RUN, *overrides])).fit()


def test_a_run_whose_episodes_all_fail_warns_each_step_then_stops(graft_plugin, tmp_path: Path,
                                                                  caplog) -> None:
    graft_plugin(BrokenToolPlugin(), name="broken-tool")
    caplog.set_level(logging.WARNING, logger="graft.rollout")
    with pytest.raises(PluginError, match=r"every episode of the last 2 steps ended in an error "
                       r"of the environment 'crashes'.*RuntimeError: tool crashed.*"
                       r"features.multiturn.max_failed_env_steps=0"):
        fit(tmp_path / "stops", "features.multiturn.environment=crashes",
            "trainer.total_steps=5",
            "features.multiturn.max_failed_env_steps=2")
    warnings = [line for line in failure_lines(caplog) if line.startswith("warning:")]
    assert len(warnings) == 1 and "every episode of this step" in warnings[0]
    assert "stops after 2 such steps in a row" in warnings[0]

    caplog.clear()
    rows = fit(tmp_path / "goes-on", "features.multiturn.environment=crashes",
               "trainer.total_steps=3",
               "features.multiturn.max_failed_env_steps=0")
    assert [row["rollout/env_error_fraction"] for row in rows] == [1.0, 1.0, 1.0]
    assert len([line for line in failure_lines(caplog) if line.startswith("warning:")]) == 3


def test_a_step_with_some_episodes_left_is_not_a_failed_step(graft_plugin, tmp_path: Path,
                                                             caplog) -> None:
    graft_plugin(BrokenToolPlugin(), name="broken-tool")
    caplog.set_level(logging.WARNING, logger="graft.rollout")
    CrashesOnOddEpisodes.built = 0
    rows = fit(tmp_path, "features.multiturn.environment=crashes-half",
               "trainer.total_steps=3",
               "features.multiturn.max_failed_env_steps=1")
    assert [row["rollout/env_error_fraction"] for row in rows] == [0.5, 0.5, 0.5]
    assert not [line for line in failure_lines(caplog) if line.startswith("warning:")]
