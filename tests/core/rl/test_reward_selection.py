"""Which reward scores each sample (algorithm.reward: a name, or auto by the sample's
data_source), and rewards called by keyword in a real RL step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graft import hookimpl
from graft.config import compose
from graft.data.tasks import TextSample, exact_match_reward, positional_match_reward
from graft.errors import PluginError
from graft.rl import RewardFunction
from graft.rl.rewards import RewardChooser, RewardScorer


def shouting(response, sample):
    return 1.0 if response == sample.answer.upper() else 0.0


class Rewards:
    @hookimpl
    def graft_reward_functions(self):
        return {"shouting": RewardFunction(shouting, data_sources=("loud/set", "loud/other")),
                "any-length": lambda response: float(len(response))}


def sample(answer: str, data_source: str = "") -> TextSample:
    return TextSample("p", "", answer, data_source=data_source)


def test_auto_picks_the_reward_that_declares_the_data_source(graft_plugin) -> None:
    graft_plugin(Rewards(), name="rewards")
    choose = RewardChooser("auto", "file")
    assert choose(sample("a", "loud/set")).fn is shouting
    assert choose(sample("a", "loud/other")).fn is shouting
    assert choose(sample("a", "quiet/set")).fn is exact_match_reward
    assert choose(sample("a")).fn is exact_match_reward
    assert RewardChooser("auto", "pattern")(sample("a")).fn is positional_match_reward
    assert RewardChooser("any-length", "file")(sample("a", "loud/set")).fn("abc") == 3.0


def test_a_data_source_declared_twice_is_an_error(graft_plugin) -> None:
    class Twin:
        @hookimpl
        def graft_reward_functions(self):
            return {"murmur": RewardFunction(shouting, data_sources="loud/set")}

    graft_plugin(Rewards(), name="rewards")
    graft_plugin(Twin(), name="twin")
    with pytest.raises(PluginError, match=r"the rewards 'shouting' and 'murmur' both declare "
                                          r"data_source 'loud/set'"):
        RewardChooser("auto", "file")
    assert RewardChooser("murmur", "file")(sample("a")).fn is shouting  # a name needs no map


def test_a_mixed_batch_is_scored_per_data_source(graft_plugin) -> None:
    graft_plugin(Rewards(), name="rewards")
    scorer = RewardScorer(cfg=compose(["data.source=file"]))
    try:
        scores = scorer.score(["AB", "ab", "AB", "ab"], [sample("ab", "loud/set"),
                                                         sample("ab", "loud/set"),
                                                         sample("ab"), sample("ab")])
    finally:
        scorer.close()
    assert scores == [1.0, 0.0, 0.0, 1.0]
    assert scorer.metrics()["reward_errors"] == 0.0


def test_a_keyword_only_reward_runs_in_an_rl_step(graft_plugin, tmp_path: Path) -> None:
    seen = []

    def keyword_only(*, response, sample, cfg):
        seen.append((type(response), sample.answer, cfg.algorithm.reward))
        return 1.0

    class KeywordOnly:
        @hookimpl
        def graft_reward_functions(self):
            return {"keyword-only": keyword_only}

    graft_plugin(KeywordOnly(), name="keyword-only")
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"say {i}:", "answer": str(i)}) + "\n"
                            for i in range(4)))
    from graft.training.trainer import Trainer

    cfg = compose([f"trainer.run_dir={tmp_path / 'run'}", "trainer.total_steps=1",
                   "engine.device=cpu", "model.preset=tiny-llama", "data.source=file",
                   f"data.path={data}", "algorithm.reward=keyword-only",
                   "rollout.prompts_per_step=2", "rollout.n=2", "rollout.max_new_tokens=3",
                   "checkpoint.save_at_end=false", "export.hf_at_end=false"])
    (metrics,) = Trainer(cfg).fit()
    assert metrics["reward_mean"] == 1.0 and metrics["reward_errors"] == 0.0
    assert len(seen) == 4 and {s[2] for s in seen} == {"keyword-only"}
    assert {s[0] for s in seen} == {str} and {s[1] for s in seen} <= {"0", "1", "2", "3"}
