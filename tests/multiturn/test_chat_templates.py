"""Episodes in the model's own format, on templates written here (conftest.py: Hermes-style with
tools, a thinking template that drops earlier <think> blocks, harmony-style channels), each with
a tokenizer trained here, and an engine that generates scripted turns.

For each: the sequence the trainer gets is the generated ids (split into single characters,
not as the tokenizer would split their text: a re-tokenised action shows) plus the template's
rendering of each tool result and generation prompt, token for token; the loss mask covers
exactly the model's tokens; a turn cut at a stop string is closed by the template's tokens."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from graft_multiturn.episodes import EpisodeLimits, EpisodeRunner
from graft_multiturn.tools import ToolEnvironment

from graft.rollout import SamplingSpec

SYSTEM_TOOLS = ('<|im_start|>system\n<tools>{"type": "function", "function": {"name": "add", '
                '"description": "Add two numbers.", "parameters": {"type": "object", '
                '"properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": '
                '["a", "b"]}}}</tools><|im_end|>\n')
CHATML_PROMPT = SYSTEM_TOOLS + "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"
CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
CALL_2 = '<tool_call>{"name": "add", "arguments": {"a": 5, "b": 1}}</tool_call>'


def result(value: str) -> str:
    """A tool result and the next generation prompt, as the ChatML templates render them."""
    return (f"<|im_start|>user\n<tool_response>\n{value}\n</tool_response><|im_end|>\n"
            f"<|im_start|>assistant\n")


HARMONY_PROMPT = (
    "<|start|>system<|message|>You are a helpful assistant.<|end|><|start|>developer<|message|>"
    "# Tools\nnamespace functions {\n// Add two numbers.\ntype add = (_: {\"type\": \"object\", "
    "\"properties\": {\"a\": {\"type\": \"number\"}, \"b\": {\"type\": \"number\"}}, "
    "\"required\": [\"a\", \"b\"]}) => any;\n} // namespace functions<|end|>"
    "<|start|>user<|message|>What is 2+3?<|end|><|start|>assistant")
HARMONY_CALL = ("<|channel|>analysis<|message|>let me add<|end|><|start|>assistant<|channel|>"
                "commentary to=functions.add <|constrain|>json<|message|>{\"a\": 2, \"b\": 3}"
                "<|call|>")
HARMONY_RESULT = ("<|start|>functions.add to=assistant<|channel|>commentary<|message|>5<|end|>"
                  "<|start|>assistant")


def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


def generated(tokenizer: Any, text: str) -> list[int]:
    """``text`` as a model might sample it: its added tokens whole, every other character a
    token of its own (never the tokenizer's own split of the text)."""
    added = sorted(tokenizer.get_added_vocab(), key=len, reverse=True)
    ids = []
    for piece in re.split("(" + "|".join(map(re.escape, added)) + ")", text):
        if piece in added:
            ids.append(tokenizer.convert_tokens_to_ids(piece))
        else:
            for char in piece:
                (one,) = tokenizer(char, add_special_tokens=False)["input_ids"]
                ids.append(one)
    assert tokenizer.decode(ids, skip_special_tokens=False) == text
    return ids


def run_episode(tokenizer, engine, *, on_prefix_break: str = "keep", turns: int = 4,
                **options: Any):
    def factory():
        return ToolEnvironment([add], tokenizer=tokenizer, **options)

    runner = EpisodeRunner(factory, tokenizer=tokenizer, limits=EpisodeLimits(turns, 1024, 5.0),
                           on_prefix_break=on_prefix_break)
    sample = SimpleNamespace(prompt="What is 2+3?", answer="5")
    return runner.run(engine, [sample], [[0]], SamplingSpec(1.0, 1.0, 256))


def runs(batch) -> tuple[list[int], list[tuple[bool, list[int]]]]:
    """The episode's whole sequence, and its runs of model (True) and other tokens."""
    (sample,) = batch.samples
    ids = sample.prompt_ids + sample.response_ids
    mask = [0.0] * len(sample.prompt_ids) + sample.loss_mask.tolist()
    assert len(sample.logprobs) == len(sample.response_ids) == len(sample.loss_mask)
    pieces: list[tuple[bool, list[int]]] = []
    for token, flag in zip(ids, mask, strict=True):
        if pieces and pieces[-1][0] == bool(flag):
            pieces[-1][1].append(token)
        else:
            pieces.append((bool(flag), [token]))
    return ids, pieces


def check_contract(tokenizer, batch, engine, model_turns: list[list[int]], text: str) -> None:
    """The trainer's ids: the model's exactly as generated (every model token trained, no
    other), the rest the template's own tokens of ``text``, the whole sequence ``text``."""
    ids, pieces = runs(batch)
    assert [piece for model, piece in pieces if model] == model_turns
    for model, piece in pieces:
        if not model:  # template tokens: the tokenizer's own split of the template's text
            assert piece == tokenizer(tokenizer.decode(piece, skip_special_tokens=False),
                                      add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids, skip_special_tokens=False) == text
    (sample,) = batch.samples
    trained = sample.logprobs[sample.loss_mask.bool()]
    expected = [-torch.arange(1, len(turn) + 1, dtype=torch.float32) / 100 for turn in model_turns]
    assert torch.equal(trained, torch.cat(expected))  # the engine's log-probs, kept
    assert (sample.logprobs[~sample.loss_mask.bool()] == 0).all()


@pytest.mark.parametrize("family", ["hermes", "thinking"])
def test_hermes_style_turns_are_the_generated_ids_plus_the_templates_tokens(
        chat_tokenizers, scripted_engine, family: str) -> None:
    tokenizer = chat_tokenizers[family]
    turns = [generated(tokenizer, CALL + "<|im_end|>"),
             generated(tokenizer, "The answer is 5.<|im_end|>")]
    engine = scripted_engine(turns)
    batch = run_episode(tokenizer, engine)
    text = CHATML_PROMPT + CALL + "<|im_end|>\n" + result("5") + "The answer is 5.<|im_end|>"
    check_contract(tokenizer, batch, engine, turns, text)
    ids = runs(batch)[0]
    assert all(ids[:len(c)] == c for c in engine.contexts)  # what the model saw, kept
    assert batch.metrics["multiturn/prefix_breaks"] == 0.0  # no <think>: append-only
    assert batch.metrics["rollout/tool_calls_mean"] == 1.0 and batch.scored == [True]


def test_a_turn_cut_at_its_call_is_closed_by_the_templates_end_of_turn(
        chat_tokenizers, scripted_engine) -> None:
    tokenizer = chat_tokenizers["hermes"]
    cut = generated(tokenizer, CALL)
    turns = [cut + generated(tokenizer, " and then"), generated(tokenizer, "5<|im_end|>")]
    engine = scripted_engine(turns)
    batch = run_episode(tokenizer, engine, stop_after_call=True)
    # the model never wrote <|im_end|> after its call: the template's, not trained
    text = CHATML_PROMPT + CALL + "<|im_end|>\n" + result("5") + "5<|im_end|>"
    check_contract(tokenizer, batch, engine, [cut, turns[1]], text)
    assert batch.metrics["multiturn/prefix_breaks"] == 0.0


THINK_TURNS = ["<think>let me add</think>" + CALL + "<|im_end|>",
               "<think>once more</think>" + CALL_2 + "<|im_end|>",
               "<think>done</think>The answer is 6.<|im_end|>"]


def test_a_thinking_template_keeps_the_history_the_model_saw_and_counts_the_break(
        chat_tokenizers, scripted_engine) -> None:
    tokenizer = chat_tokenizers["thinking"]
    turns = [generated(tokenizer, t) for t in THINK_TURNS]
    engine = scripted_engine(turns)
    batch = run_episode(tokenizer, engine)
    # the template would drop the first turn's <think>: the model's own tokens stay
    text = (CHATML_PROMPT + THINK_TURNS[0] + "\n" + result("5") + THINK_TURNS[1] + "\n"
            + result("6") + THINK_TURNS[2])
    check_contract(tokenizer, batch, engine, turns, text)
    ids = runs(batch)[0]
    assert all(ids[:len(c)] == c for c in engine.contexts)
    assert batch.metrics["multiturn/prefix_breaks"] == 1.0  # found once, then kept


def test_a_thinking_template_resegments_and_trains_the_new_segment_only(
        chat_tokenizers, scripted_engine) -> None:
    tokenizer = chat_tokenizers["thinking"]
    turns = [generated(tokenizer, t) for t in THINK_TURNS]
    engine = scripted_engine(turns)
    batch = run_episode(tokenizer, engine, on_prefix_break="resegment")
    history_1 = CHATML_PROMPT + CALL + "<|im_end|>\n" + result("5")  # <think> dropped
    history_2 = history_1 + CALL_2 + "<|im_end|>\n" + result("6")
    # the model went on from the template's rendering, each time
    assert [tokenizer.decode(c, skip_special_tokens=False) for c in engine.contexts] == [
        CHATML_PROMPT, history_1, history_2]
    assert engine.contexts[1] == tokenizer(history_1, add_special_tokens=False)["input_ids"]
    # the last segment: the re-rendered history (not trained), then the last turn (trained)
    check_contract(tokenizer, batch, engine, [turns[2]], history_2 + THINK_TURNS[2])
    assert batch.metrics["multiturn/prefix_breaks"] == 2.0


def test_harmony_style_channels(chat_tokenizers, scripted_engine) -> None:
    tokenizer = chat_tokenizers["harmony"]
    turns = [generated(tokenizer, HARMONY_CALL),
             generated(tokenizer, "<|channel|>final<|message|>The answer is 5.<|return|>")]
    engine = scripted_engine(turns)
    batch = run_episode(tokenizer, engine)
    text = (HARMONY_PROMPT + HARMONY_CALL + HARMONY_RESULT
            + "<|channel|>final<|message|>The answer is 5.<|return|>")
    check_contract(tokenizer, batch, engine, turns, text)
    assert batch.metrics["multiturn/prefix_breaks"] == 0.0
    assert batch.metrics["rollout/tool_calls_mean"] == 1.0


@pytest.mark.parametrize("family, text", [
    ("hermes", '<tool_call>{"name": "add", "arguments": {"a": 2}}</tool_call><|im_end|>'),
    ("hermes", '<tool_call>{"name": "mul", "arguments": {"a": 2, "b": 3}}</tool_call><|im_end|>'),
    ("harmony", "<|channel|>commentary to=functions.add <|constrain|>json<|message|>{a: 2}"
                "<|call|>")])
def test_a_malformed_call_ends_the_episode_as_a_malformed_action(
        chat_tokenizers, scripted_engine, family: str, text: str) -> None:
    tokenizer = chat_tokenizers[family]
    batch = run_episode(tokenizer, scripted_engine([generated(tokenizer, text)]))
    assert batch.rewards == [0.0] and batch.scored == [False]
    assert batch.metrics["rollout/malformed_actions"] == 1.0
    assert batch.metrics["rollout/env_errors"] == 0.0


def test_the_tool_list_is_the_templates_tools_argument(chat_tokenizers) -> None:
    from graft_multiturn.tools import Tool

    env = ToolEnvironment([add], tokenizer=chat_tokenizers["hermes"])
    assert env.tools == [Tool(add).schema]
    assert json.dumps(env.tools[0]) in SYSTEM_TOOLS
    assert env.tool_format.name == "hermes"
    assert ToolEnvironment([add], tokenizer=chat_tokenizers["harmony"]).tool_format.name == \
        "harmony"


@pytest.mark.parametrize("mode", ["keep", "resegment"])
def test_samples_show_the_conversation_as_the_model_saw_it(chat_tokenizers, scripted_engine,
                                                           mode: str) -> None:
    from graft.training.samples import shown_to_model

    tokenizer = chat_tokenizers["thinking"]
    turns = [generated(tokenizer, t) for t in THINK_TURNS]
    batch = run_episode(tokenizer, scripted_engine(turns), on_prefix_break=mode)
    shown = shown_to_model(batch.samples[0], tokenizer)
    assert shown.prompt == CHATML_PROMPT
    pieces = [(t["role"], t["text"]) for t in shown.turns]
    if mode == "keep":
        assert pieces == [("assistant", THINK_TURNS[0]), ("tool", "\n" + result("5")),
                          ("assistant", THINK_TURNS[1]), ("tool", "\n" + result("6")),
                          ("assistant", THINK_TURNS[2])]
    else:  # the template's rendering the model went on from, then its last turn
        history = CALL + "<|im_end|>\n" + result("5") + CALL_2 + "<|im_end|>\n" + result("6")
        assert pieces == [("history", history), ("assistant", THINK_TURNS[2])]
    assert {t["source"] for t in shown.turns if t["role"] == "assistant"} == {"model"}
