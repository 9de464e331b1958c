"""Tools as typed functions, and the tool-call formats (no model)."""

from __future__ import annotations

from typing import Annotated, Literal

import pytest
from graft_multiturn import MalformedAction
from graft_multiturn.tools import (
    TOOL_FORMATS,
    ParsedTurn,
    Tool,
    ToolCall,
    register_tool_format,
    resolve_tool_format,
    tool,
)


@tool
def search(query: Annotated[str, "what to look for"], limit: int = 3,
           order: Literal["new", "old"] = "new", tags: list[str] | None = None) -> list[str]:
    """Search the notes.

    Longer text that is not the description."""
    return [query] * limit


def test_a_schema_comes_from_the_signature_and_the_docstring() -> None:
    assert search.schema == {"type": "function", "function": {
        "name": "search", "description": "Search the notes.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string", "description": "what to look for"},
            "limit": {"type": "integer"}, "order": {"type": "string", "enum": ["new", "old"]},
            "tags": {"type": "array", "items": {"type": "string"}}},
            "required": ["query"]}}}
    declared = {"type": "function", "function": {"name": "q", "parameters": {}}}
    assert Tool(lambda: "x", schema=declared).name == "q"
    with pytest.raises(TypeError, match="no type annotation"):
        Tool(lambda x: x)


@pytest.mark.parametrize("arguments, message", [
    ({}, r"missing \['query'\]"), ({"query": "a", "page": 2}, r"unknown \['page'\]"),
    ({"query": 3}, "query=3 is not string"), ({"query": "a", "limit": True}, "not integer"),
    ({"query": "a", "order": "any"}, "order='any'"), ("a", "not an object")])
def test_arguments_that_do_not_fit_are_a_malformed_action(arguments, message: str) -> None:
    with pytest.raises(MalformedAction, match=message):
        search.call(arguments)
    assert search.call({"query": "a", "limit": 2}) == '["a", "a"]'


def test_hermes_reads_calls_thinking_and_content() -> None:
    hermes = TOOL_FORMATS["hermes"]
    turn = hermes.parse('<think>hm</think>Let me look.<tool_call>{"name": "search", "arguments": '
                        '{"query": "x"}}</tool_call><tool_call>{"name": "f", "arguments": '
                        '"{\\"a\\": 1}"}</tool_call>')
    assert turn == ParsedTurn("Let me look.", "hm", [ToolCall("search", {"query": "x"}),
                                                      ToolCall("f", {"a": 1})])
    assert hermes.message(turn)["tool_calls"][0] == {
        "type": "function", "function": {"name": "search", "arguments": {"query": "x"}}}
    assert hermes.parse("<tool_call>{oops}</tool_call>").errors
    # a call the engine cut before its end is text, not a malformed call (as <calc> is)
    assert hermes.parse('42<tool_call>{"name": "f"') == ParsedTurn('42<tool_call>{"name": "f"')
    assert hermes.parse("just 42") == ParsedTurn("just 42")


def test_harmony_and_llama3() -> None:
    harmony = TOOL_FORMATS["harmony"]
    turn = harmony.parse("<|channel|>analysis<|message|>hm<|end|><|start|>assistant<|channel|>"
                         "commentary to=functions.search <|constrain|>json<|message|>"
                         '{"query": "x"}<|call|>')
    assert turn == ParsedTurn("", "hm", [ToolCall("search", {"query": "x"})])
    # a call the engine cut before <|call|> is text, as Hermes's is; a finished one that does
    # not parse is malformed
    cut = "<|channel|>commentary to=functions.search <|constrain|>json<|message|>{\"qu"
    assert harmony.parse(cut) == ParsedTurn(cut)
    assert harmony.parse(cut + "<|call|>").errors
    assert harmony.parse("<|channel|>final<|message|>42").content == "42"
    llama3 = TOOL_FORMATS["llama3"]
    assert llama3.parse('<|python_tag|>{"name": "search", "parameters": {"query": "x"}}') == \
        ParsedTurn("", calls=[ToolCall("search", {"query": "x"})])
    assert llama3.parse("It is 42.") == ParsedTurn("It is 42.")
    assert llama3.parse('{"name": ').errors


def test_a_plugin_registers_its_own_format_and_auto_finds_it() -> None:
    class Bracket:
        name, call_end = "bracket", "]]"

        def detect(self, template: str) -> bool:
            return "[[call" in template

        def parse(self, text: str) -> ParsedTurn:
            return ParsedTurn(text)

        def message(self, turn: ParsedTurn) -> dict:
            return {"role": "assistant", "content": turn.content}

    class Tokenizer:
        chat_template = "{{ '[[call' }}"

    format_ = register_tool_format(Bracket())
    try:
        assert resolve_tool_format("auto", Tokenizer()) is format_
        assert resolve_tool_format("bracket") is format_
    finally:
        del TOOL_FORMATS["bracket"]
    with pytest.raises(ValueError, match="no tool-call format 'bracket'; known: auto, hermes"):
        resolve_tool_format("bracket")
    with pytest.raises(ValueError, match="found no tool-call format"):
        resolve_tool_format("auto", Tokenizer())


def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


def test_a_harmony_call_cut_before_its_end_is_text_and_a_finished_one_runs(
        chat_tokenizers) -> None:
    """Through `ToolEnvironment.step` on harmony-style token ids: ``<|call|>`` (a special
    token, where the engine stops) marks a finished call; without it the call was cut
    (``rollout.max_new_tokens``) and the turn is the final answer, not a malformed action."""
    from graft_multiturn.tools import ToolEnvironment

    tokenizer = chat_tokenizers["harmony"]
    call = ('<|channel|>commentary to=functions.add <|constrain|>json<|message|>'
            '{"a": 2, "b": 3}')
    ids = tokenizer.encode(call + "<|call|>", add_special_tokens=False)
    env = ToolEnvironment([add], tokenizer=tokenizer, tool_format="harmony")
    env.reset("What is 2+3?")
    observation, _, done = env.step(ids, "")
    assert not done and observation == [{"role": "tool", "name": "add", "content": "5"}]
    env.reset("What is 2+3?")
    assert env.step(ids[:-3], "") == (None, None, True)
    broken = tokenizer.encode(call[:-1] + "<|call|>", add_special_tokens=False)
    with pytest.raises(MalformedAction):
        env.reset("What is 2+3?")
        env.step(broken, "")
