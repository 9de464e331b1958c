"""Multi-turn episodes on the embedded engine (a tiny Llama on CPU): token in, token out; the
loss covers the model's tokens only; a broken environment ends its episode, never the run.

`check_ids_unchanged` and `check_two_ranks` take the engine: tests/vllm/test_episodes.py runs
them with graft-vllm's."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import torch
from graft_multiturn import MalformedAction
from graft_multiturn.episodes import EpisodeLimits, EpisodeRunner

from graft import hookimpl
from graft.config import compose
from graft.errors import ConfigError
from graft.rollout import SamplingSpec
from graft.training.trainer import Trainer

RUN = ("engine.device=cpu", "model.preset=tiny-llama", "rollout.prompts_per_step=2",
       "rollout.n=2", "rollout.max_new_tokens=5", "checkpoint.every_steps=0",
       "checkpoint.save_at_end=false", "export.hf_at_end=false")
TOOL_IDS = [7, 7, 9]  # what the tool answers in its first turn, as ids (built-in tokenizer)


class Toolbox:
    """Answers turn 1 with text, turn 2 with ids, ends at turn 3 with a reward; records every
    action it was given and every observation's ids it returned."""

    log: list[list[list[int]]] = []  # per episode: action, observation, action, ...

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.turn, self.seen = tokenizer, 0, []
        Toolbox.log.append(self.seen)

    def reset(self, sample):
        return None  # the sample's prompt as the data loader encoded it

    def step(self, action_ids, action_text):
        self.turn += 1
        self.seen.append(list(action_ids))
        if self.turn == 1:
            self.seen.append(self.tokenizer("<r>", add_special_tokens=False)["input_ids"])
            return "<r>", None, False
        if self.turn == 2:
            self.seen.append(list(TOOL_IDS))
            return list(TOOL_IDS), 0.25, False
        return None, 0.5, True


class Recorder:
    """Keeps the trainer's input ids and loss mask of every sample of the update pass."""

    def __init__(self) -> None:
        self.inputs: list[tuple[list[int], list[float]]] = []

    @hookimpl
    def graft_prepare_inputs(self, batch, layout, phase):
        if phase == "update":
            for ids, mask in zip(layout.unpad(batch["input_ids"]),
                                 layout.unpad(batch["loss_mask"]), strict=True):
                self.inputs.append((ids.tolist(), mask.tolist()))


def tokens_trained_on(*, logp):
    """1 per token: under loss.loss_agg_mode=token-sum the loss is the count of tokens the
    loss mask lets through."""
    return torch.ones_like(logp) + 0.0 * logp, {}


class ToolboxPlugin:
    @hookimpl
    def graft_environments(self):
        return {"toolbox": lambda *, tokenizer: Toolbox(tokenizer)}

    @hookimpl
    def graft_policy_losses(self):
        return {"tokens-trained-on": tokens_trained_on}


def fit(tmp_path: Path, *overrides: str) -> tuple[Trainer, list[dict]]:
    trainer = Trainer(compose([f"trainer.run_dir={tmp_path}", "trainer.total_steps=1", *RUN,
                               *overrides]))
    return trainer, trainer.fit()


def test_hook_graft_environments_adds_a_selectable_environment(graft_plugin) -> None:
    graft_plugin(ToolboxPlugin(), name="toolbox")
    cfg = compose(["features.multiturn.environment=toolbox"])
    assert cfg.features.multiturn.environment == "toolbox"
    with pytest.raises(ConfigError, match=r"features.multiturn.environment.*toolbox"):
        compose(["features.multiturn.environment=toolbx"])


def test_the_trainer_sees_the_generated_and_the_environments_ids_unchanged(
        graft_plugin, tmp_path: Path) -> None:
    check_ids_unchanged(graft_plugin, tmp_path, "embedded")


def check_ids_unchanged(graft_plugin, tmp_path: Path, engine: str) -> None:
    """The trainer's ids are the generated and the environment's, unchanged, with ``engine``."""
    graft_plugin(ToolboxPlugin(), name="toolbox")
    recorder = Recorder()
    graft_plugin(recorder, name="recorder")
    Toolbox.log = []
    trainer, (metrics,) = fit(tmp_path, "features.multiturn.environment=toolbox",
                              f"rollout.engine={engine}",
                              "loss.policy_loss=tokens-trained-on", "loss.loss_agg_mode=token-sum")
    assert len(Toolbox.log) == 4 and len(recorder.inputs) == 4
    prompts = {tuple(ids) for ids in trainer.job.prompts}
    for (ids, mask), pieces in zip(recorder.inputs, Toolbox.log, strict=True):
        response = [t for piece in pieces for t in piece]
        prompt = ids[:len(ids) - len(response)]
        assert tuple(prompt) in prompts and ids == prompt + response  # token in, token out
        # the loss covers the model's tokens (actions, even pieces) and nothing else
        expected = [0.0] * (len(prompt) - 1)
        for index, piece in enumerate(pieces):
            expected += [1.0 if index % 2 == 0 else 0.0] * len(piece)
        assert mask == expected + [0.0]
    # the loss sees the model's tokens only: the tool's would add to it
    model_tokens = sum(len(p) for pieces in Toolbox.log for p in pieces[::2])
    assert metrics["loss"] == model_tokens < sum(len(p) for ps in Toolbox.log for p in ps)
    assert metrics["rollout/turns_mean"] == 3.0 and metrics["rollout/tool_calls_mean"] == 2.0
    assert metrics["reward_mean"] == 0.75 and metrics["rollout/env_errors"] == 0.0
    # the engine's log-probs of the model tokens are the trainer's, on the same ids (vLLM's own
    # kernels: today's bound of tests/core/training/test_rl_cli.py)
    assert metrics["train_infer_logprob_diff"] < (1e-5 if engine == "embedded" else 1e-4)


class OneTurn:
    """A single turn, scored by the configured reward: what features.multiturn.environment=none
    does."""

    def reset(self, sample):
        return None

    def step(self, action_ids, action_text):
        return None, None, True


def test_a_one_turn_environment_trains_bit_identically_to_no_environment(
        graft_plugin, tmp_path: Path) -> None:
    class Plugin:
        @hookimpl
        def graft_environments(self):
            return {"one-turn": OneTurn}

    graft_plugin(Plugin(), name="one-turn")
    keys = ("loss", "grad_norm", "reward_mean", "response_length", "entropy", "tokens")
    _, plain = fit(tmp_path / "plain", "trainer.total_steps=2")
    _, episodes = fit(tmp_path / "episodes", "trainer.total_steps=2",
                      "features.multiturn.environment=one-turn",
                      "features.multiturn.max_turns=1")
    for a, b in zip(plain, episodes, strict=True):
        assert {k: a[k] for k in keys} == {k: b[k] for k in keys}


@pytest.fixture(scope="module")
def engine_and_tokenizer(tmp_path_factory: pytest.TempPathFactory):
    trainer = Trainer(compose([f"trainer.run_dir={tmp_path_factory.mktemp('episodes')}", *RUN]))
    return trainer.job.rollout, trainer.tokenizer


def run_episodes(engine_and_tokenizer, factory, *, timeout_s: float = 5.0, turns: int = 3,
                 tokens: int = 64, count: int = 2):
    engine, tokenizer = engine_and_tokenizer
    runner = EpisodeRunner(factory, tokenizer=tokenizer,
                           limits=EpisodeLimits(turns, tokens, timeout_s))
    prompts = [tokenizer("say ab:", add_special_tokens=False)["input_ids"]] * count
    return runner.run(engine, [None] * count, prompts, SamplingSpec(1.0, 1.0, 4))


class Raises(OneTurn):
    def step(self, action_ids, action_text):
        raise RuntimeError("tool crashed")


class Hangs(OneTurn):
    def step(self, action_ids, action_text):
        time.sleep(3)
        return None, 1.0, True


class Garbled(OneTurn):
    def step(self, action_ids, action_text):
        return "not a tuple"


class OutOfVocabulary(OneTurn):
    def step(self, action_ids, action_text):
        return [10 ** 6], 1.0, False


class RefusesTheAction(OneTurn):
    def step(self, action_ids, action_text):
        raise MalformedAction("<calc>1+</calc> does not parse")


class BadReset(OneTurn):
    def reset(self, sample):
        raise ValueError("no such task")


class CannotStart(OneTurn):
    def __init__(self) -> None:
        raise OSError("sandbox unavailable")


@pytest.mark.parametrize("factory, reason", [
    (Raises, "raised RuntimeError: tool crashed"), (Hangs, "took longer than"),
    (Garbled, "not (observation, reward, done)"), (OutOfVocabulary, "outside the tokenizer"),
    (BadReset, "raised ValueError: no such task"),
    (CannotStart, "raised OSError: sandbox unavailable")])
def test_a_broken_environment_ends_its_episode_with_reward_0(engine_and_tokenizer, factory,
                                                            reason, caplog) -> None:
    started = time.perf_counter()
    batch = run_episodes(engine_and_tokenizer, factory, timeout_s=0.3)
    assert time.perf_counter() - started < 2.5  # the hung calls were not waited for
    assert batch.rewards == [0.0, 0.0] and batch.metrics["rollout/env_errors"] == 2.0
    assert batch.scored == [False, False] and reason in caplog.text
    turns = 0 if factory in (BadReset, CannotStart) else 1
    assert batch.metrics["rollout/turns_mean"] == turns
    assert all(len(s.response_ids) == len(s.logprobs) == len(s.loss_mask) for s in batch.samples)


def test_a_malformed_action_ends_the_episode_and_is_counted_apart(engine_and_tokenizer) -> None:
    batch = run_episodes(engine_and_tokenizer, RefusesTheAction)
    assert batch.rewards == [0.0, 0.0] and batch.metrics["rollout/env_errors"] == 0.0
    assert batch.metrics["rollout/malformed_actions"] == 2.0


class Chatty(OneTurn):
    """An async environment that always answers with text and never ends the episode."""

    async def step(self, action_ids, action_text):
        await asyncio.sleep(0)
        return "ok", 1.0, False


@pytest.mark.parametrize("turns, tokens", [(2, 64), (10, 12)])
def test_limits_end_an_episode(engine_and_tokenizer, turns: int, tokens: int) -> None:
    batch = run_episodes(engine_and_tokenizer, Chatty, turns=turns, tokens=tokens)
    assert all(batch.scored)  # a limit, not the environment, ended them: algorithm.reward adds
    for sample, reward in zip(batch.samples, batch.rewards, strict=True):
        assert len(sample.response_ids) <= tokens and reward >= 1.0
        assert sample.loss_mask.sum() == sum(len(s) for s in [sample.response_ids]) - \
            2 * (int(reward) - 1)  # "ok" after every turn but the last
    assert batch.metrics["rollout/turns_mean"] <= turns


class StopsAtTheTag(OneTurn):
    stop = tuple("abcdefghijklmnopqrstuvwxyz")  # any lower-case letter ends a turn
    actions: list[str] = []

    def step(self, action_ids, action_text):
        StopsAtTheTag.actions.append(action_text)
        return None, None, True


def test_a_turn_is_cut_right_after_a_stop_string(engine_and_tokenizer) -> None:
    StopsAtTheTag.actions = []
    batch = run_episodes(engine_and_tokenizer, StopsAtTheTag, count=16)
    for text, sample in zip(StopsAtTheTag.actions, batch.samples, strict=True):
        assert not any(c.islower() for c in text[:-1]), text
        assert len(sample.logprobs) == len(sample.response_ids)
    assert any(text[-1:].islower() and len(text) < 4 for text in StopsAtTheTag.actions)


def test_messages_are_rendered_alone_so_a_rewriting_template_cannot_change_earlier_tokens(
) -> None:
    import copy

    from graft_multiturn.observations import observation_ids

    from graft.data.tokenizer import builtin_tokenizer

    tokenizer = copy.deepcopy(builtin_tokenizer())
    # not append-only: every message but the last is shortened to its first letter
    tokenizer.chat_template = ("{% for m in messages %}{% if loop.last %}[{{ m.content }}]"
                               "{% else %}[{{ m.content[0] }}]{% endif %}{% endfor %}"
                               "{% if add_generation_prompt %}>{% endif %}")
    ids = observation_ids([{"role": "tool", "content": "42"}], tokenizer)
    assert tokenizer.decode(ids) == "[42]>"
    assert observation_ids("42", tokenizer) == tokenizer("42", add_special_tokens=False)[
        "input_ids"]
    assert observation_ids(torch.tensor([5, 6]).tolist(), tokenizer) == [5, 6]


def test_validation_runs_episodes_too(graft_plugin, tmp_path: Path) -> None:
    graft_plugin(ToolboxPlugin(), name="toolbox")
    held_out = tmp_path / "val.jsonl"
    held_out.write_text("".join(f'{{"prompt": "say {w}:", "answer": "abab"}}\n' for w in "ab"))
    Toolbox.log = []
    _, rows = fit(tmp_path, "features.multiturn.environment=toolbox",
                  f"data.val_path={held_out}",
                  "trainer.val_every_steps=1", "val.n=2")
    validated = [row["val/reward_mean"] for row in rows if "val/reward_mean" in row]
    assert validated == [0.75, 0.75]  # the environment's 0.25 + 0.5: three turns each
    assert len(Toolbox.log) == 4 + 2 * 2 * 2  # the step's, and validation at steps 0 and 1



@pytest.mark.slow  # torchrun, 2 gloo ranks, 2 steps (~10 s on 2 cores; vLLM ~65 s)
def test_every_rank_runs_the_busiest_ranks_turns(tmp_path: Path) -> None:
    check_two_ranks(tmp_path, "embedded")


def check_two_ranks(tmp_path: Path, engine: str) -> None:
    """Episodes of 1 turn on rank 0 and 3 on rank 1 (tests/scripts/episodes_two_ranks.py):
    rank 0 keeps generating for a stand-in while rank 1 finishes, or both would hang."""
    import json
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "scripts" / "episodes_two_ranks.py"
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node=2", str(script), str(tmp_path), engine],
                          capture_output=True, text=True, timeout=120 if engine == "embedded"
                          else 300)
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("METRICS ")]
    for row in json.loads(line.removeprefix("METRICS ")):
        # over both ranks' episodes: half of 1 turn, half of 3 (2 tool calls, reward 1 a turn)
        assert (row["rollout/turns_mean"], row["rollout/tool_calls_mean"]) == (2.0, 1.0)
        assert row["reward_mean"] == 2.0 and row["train_infer_logprob_diff"] < 1e-5
