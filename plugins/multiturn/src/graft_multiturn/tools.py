"""Tool calling in the model's own format (no torch).

* A tool is a typed Python function (`Tool`, `tool`): its JSON schema comes from its signature
  (``int``, ``float``, ``str``, ``bool``, ``list[...]``, ``dict``, ``Literal[...]``, optional
  parameters with defaults; ``Annotated[T, "what it is"]`` describes a parameter) and its
  docstring's first paragraph, or is declared (``Tool(fn, schema=...)``).
* The tool list goes into the prompt through the chat template's ``tools`` argument
  (`ToolEnvironment` exposes it as ``tools``; graft-multiturn's episodes render the prompt with
  it).
* A model turn is parsed by the `ToolFormat` of its template family (`TOOL_FORMATS`:
  ``hermes`` for Hermes/Qwen ``<tool_call>{json}</tool_call>``, ``harmony`` for GPT-OSS-style
  channels, ``llama3`` for Llama 3's JSON object); ``auto`` picks one from the chat template's
  text. A plugin adds its own with `register_tool_format`.
* Results go back as ``tool`` messages, which the episode renders through the template; a call
  that does not parse, names no known tool or has arguments that do not fit the schema raises
  `graft_multiturn.MalformedAction` (the episode ends with reward 0, counted in
  ``rollout/malformed_actions``).
"""

from __future__ import annotations

import inspect
import json
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from graft_multiturn.environment import MalformedAction, Observation

JSON_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean", list: "array",
              dict: "object"}


def _type_schema(annotation: Any) -> dict[str, Any]:
    """The JSON schema of a parameter's annotation."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        schema = _type_schema(args[0])
        described = [a for a in args[1:] if isinstance(a, str)]
        return {**schema, "description": described[0]} if described else schema
    if origin is Literal:
        kinds = {type(a) for a in args}
        schema = {"enum": list(args)}
        return {"type": JSON_TYPES[kinds.pop()], **schema} if len(kinds) == 1 else schema
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _type_schema(inner[0]) if len(inner) == 1 else {
            "anyOf": [_type_schema(a) for a in inner]}
    if origin in (list, tuple, Sequence) or annotation in (list, tuple):
        return {"type": "array", **({"items": _type_schema(args[0])} if args else {})}
    if origin in (dict, Mapping) or annotation is dict:
        return {"type": "object"}
    if annotation in JSON_TYPES:
        return {"type": JSON_TYPES[annotation]}
    raise TypeError(f"a tool parameter of type {annotation!r}: use int, float, str, bool, "
                    f"list, dict, Literal or Optional of them, or declare the schema")


def function_schema(fn: Callable[..., Any], name: str | None = None) -> dict[str, Any]:
    """``{"type": "function", "function": {name, description, parameters}}`` of ``fn`` from its
    signature and docstring (the form chat templates' ``tools`` take)."""
    hints = typing.get_type_hints(fn, include_extras=True)
    properties, required = {}, []
    for parameter in inspect.signature(fn).parameters.values():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if parameter.name not in hints:
            raise TypeError(f"the tool {fn.__name__}'s parameter {parameter.name!r} has no type "
                            f"annotation")
        properties[parameter.name] = _type_schema(hints[parameter.name])
        if parameter.default is parameter.empty:
            required.append(parameter.name)
    description = inspect.cleandoc(fn.__doc__ or "").split("\n\n")[0].replace("\n", " ")
    return {"type": "function", "function": {
        "name": name or fn.__name__, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required}}}


class Tool:
    """A typed function the model may call: ``schema`` (what the template renders) and
    `call` (arguments checked against it)."""

    def __init__(self, fn: Callable[..., Any], *, name: str | None = None,
                 schema: Mapping[str, Any] | None = None) -> None:
        self.fn = fn
        self.schema = dict(schema) if schema is not None else function_schema(fn, name)
        self.name = self.schema["function"]["name"]

    def call(self, arguments: Any) -> str:
        """``fn(**arguments)`` as text (a str as it is, else JSON); `MalformedAction` for
        arguments that are not an object, miss a required one, name an unknown one or have
        the wrong JSON type."""
        if not isinstance(arguments, Mapping):
            raise MalformedAction(f"{self.name}: arguments {_short(arguments)} are not an object")
        parameters = self.schema["function"].get("parameters", {})
        known = parameters.get("properties", {})
        missing = [p for p in parameters.get("required", []) if p not in arguments]
        unknown = [p for p in arguments if known and p not in known]
        if missing or unknown:
            raise MalformedAction(f"{self.name}: " + "; ".join(
                part for part in (f"missing {missing}" if missing else "",
                                  f"unknown {unknown}" if unknown else "") if part))
        for key, value in arguments.items():
            if key in known and not _fits(value, known[key]):
                raise MalformedAction(f"{self.name}: {key}={_short(value)} is not "
                                      f"{known[key].get('type', known[key])}")
        value = self.fn(**arguments)
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def tool(fn: Callable[..., Any] | None = None, *, name: str | None = None) -> Any:
    """``@tool`` (or ``tool(fn)``): a `Tool` of ``fn``, its schema from the signature."""
    if fn is None:
        return lambda f: Tool(f, name=name)
    return Tool(fn, name=name)


def _fits(value: Any, schema: Mapping[str, Any]) -> bool:
    if "enum" in schema:
        return value in schema["enum"]
    kind = schema.get("type")
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    expected = {"string": str, "boolean": bool, "array": list, "object": dict}.get(kind)
    return expected is None or isinstance(value, expected)


@dataclass(frozen=True)
class ToolCall:
    """One call the model made: the tool's ``name`` and its ``arguments`` (decoded JSON)."""

    name: str
    arguments: Any


@dataclass
class ParsedTurn:
    """A model turn as its format reads it: ``content`` (the answer text), ``reasoning``
    (thinking, or None), ``calls``, and ``errors`` (calls that do not parse)."""

    content: str
    reasoning: str | None = None
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class ToolFormat(Protocol):
    """How one template family writes tool calls. ``name``; ``call_end``: the text that ends a
    call (a stop string for an environment that answers one call per turn; "" when it is a
    special token); ``ends`` (optional): special tokens that end a message in this format,
    kept at the end of the text `parse` gets so that it can tell a finished call from one the
    engine cut; `detect` (whether a chat template's text is of this family); `parse` (a turn's
    text, special tokens kept, its trailing special tokens other than ``ends`` removed);
    `message` (the assistant message the template renders back into the same text)."""

    name: str
    call_end: str

    def detect(self, template: str) -> bool: ...

    def parse(self, text: str) -> ParsedTurn: ...

    def message(self, turn: ParsedTurn) -> dict[str, Any]: ...


def _arguments(raw: Any) -> Any:
    return json.loads(raw) if isinstance(raw, str) else raw


def _call_of(payload: str, arguments_key: str) -> ToolCall:
    """A ``{"name": ..., <arguments_key>: {...}}`` call; ValueError when it is not one."""
    value = json.loads(payload)
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        raise ValueError("not an object with a name")
    return ToolCall(value["name"], _arguments(value.get(arguments_key, {})))


def _tool_calls(calls: list[ToolCall]) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in calls]


def _assistant_message(turn: ParsedTurn, *, reasoning_key: str) -> dict[str, Any]:
    """The assistant message a template renders back into ``turn``'s text: its content, its
    reasoning under the family's key, its calls as ``tool_calls``."""
    message: dict[str, Any] = {"role": "assistant", "content": turn.content}
    if turn.reasoning is not None:
        message[reasoning_key] = turn.reasoning
    if turn.calls:
        message["tool_calls"] = _tool_calls(turn.calls)
    return message


class HermesFormat:
    """Hermes/Qwen: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` after the
    content, thinking in ``<think>...</think>`` (``reasoning_content``)."""

    name = "hermes"
    call_end = "</tool_call>"
    OPEN, CLOSE = "<tool_call>", "</tool_call>"

    def detect(self, template: str) -> bool:
        return self.OPEN in template

    def parse(self, text: str) -> ParsedTurn:
        reasoning = None
        if "</think>" in text:
            thought, text = text.split("</think>", 1)
            reasoning = thought.split("<think>", 1)[-1]
        head, _, rest = text.partition(self.OPEN)
        turn = ParsedTurn(head, reasoning)
        if not _:
            return turn
        for piece in (self.OPEN + rest).split(self.OPEN)[1:]:
            payload, closed, _tail = piece.partition(self.CLOSE)
            if not closed:  # cut before its end (max_new_tokens): text, not a call, as <calc>
                turn.content += self.OPEN + payload
                continue
            try:
                turn.calls.append(_call_of(payload.strip(), "arguments"))
            except ValueError as exc:
                turn.errors.append(f"{self.OPEN}{payload[:60]}{self.CLOSE}: {exc}")
        return turn

    def message(self, turn: ParsedTurn) -> dict[str, Any]:
        return _assistant_message(turn, reasoning_key="reasoning_content")


class HarmonyFormat:
    """GPT-OSS harmony channels: ``<|channel|>analysis`` (thinking), ``<|channel|>commentary
    to=functions.NAME <|constrain|>json<|message|>{...}<|call|>`` (a call), ``<|channel|>final``
    (the answer); messages after the first start with ``<|start|>assistant``."""

    name = "harmony"
    call_end = ""  # <|call|> is a special token: the turn ends there (eos)
    HEADER = re.compile(r"<\|channel\|>(\w+)(?:\s+to=functions\.([\w.\-]+))?\s*"
                        r"(?:<\|constrain\|>\s*\w+)?<\|message\|>", re.S)
    ends = ("<|end|>", "<|call|>", "<|return|>")

    def detect(self, template: str) -> bool:
        return "<|channel|>" in template

    def parse(self, text: str) -> ParsedTurn:
        turn = ParsedTurn("")
        for part in text.split("<|start|>assistant"):
            if not part.strip():
                continue
            header = self.HEADER.match(part)
            if header is None:
                turn.content += part
                continue
            body = part[header.end():]
            channel, recipient = header.group(1), header.group(2)
            if recipient and not body.endswith(self.ends):
                turn.content += part  # cut before <|call|> (max_new_tokens): text, as Hermes's
                continue
            for end in self.ends:
                body = body.removesuffix(end)
            if recipient:
                try:
                    turn.calls.append(ToolCall(recipient, json.loads(body)))
                except ValueError as exc:
                    turn.errors.append(f"functions.{recipient}: {body[:60]!r}: {exc}")
            elif channel == "analysis":
                turn.reasoning = (turn.reasoning or "") + body
            else:
                turn.content += body
        return turn

    def message(self, turn: ParsedTurn) -> dict[str, Any]:
        return _assistant_message(turn, reasoning_key="thinking")


class Llama3Format:
    """Llama 3: a turn that is one JSON object ``{"name": ..., "parameters": {...}}``
    (optionally after ``<|python_tag|>``) is a call; any other turn is content."""

    name = "llama3"
    call_end = ""
    TAG = "<|python_tag|>"

    def detect(self, template: str) -> bool:
        return "ipython" in template or self.TAG in template

    def parse(self, text: str) -> ParsedTurn:
        body = text.removeprefix(self.TAG).strip()
        if not body.startswith("{"):
            return ParsedTurn(text)
        try:
            return ParsedTurn("", calls=[_call_of(body, "parameters")])
        except ValueError as exc:
            return ParsedTurn("", errors=[f"{body[:60]!r}: {exc}"])

    def message(self, turn: ParsedTurn) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": turn.content}
        if turn.calls:
            message["tool_calls"] = _tool_calls(turn.calls)
        return message


TOOL_FORMATS: dict[str, ToolFormat] = {}


def register_tool_format(format_: ToolFormat) -> ToolFormat:
    """Add a `ToolFormat` under its ``name`` (a plugin's own template family); ``auto`` tries
    the formats in the order they were added."""
    TOOL_FORMATS[format_.name] = format_
    return format_


for _format in (HermesFormat(), HarmonyFormat(), Llama3Format()):
    register_tool_format(_format)


def resolve_tool_format(name: str | ToolFormat, tokenizer: Any = None) -> ToolFormat:
    """The `ToolFormat` called ``name`` (or ``name`` itself); ``auto``: the first whose
    ``detect`` accepts the tokenizer's chat template. A ValueError names the choices."""
    if not isinstance(name, str):
        return name
    if name != "auto":
        if name not in TOOL_FORMATS:
            raise ValueError(f"no tool-call format {name!r}; known: auto, "
                             f"{', '.join(TOOL_FORMATS)} (register_tool_format adds one)")
        return TOOL_FORMATS[name]
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):
        template = "\n".join(template.values())
    for format_ in TOOL_FORMATS.values():
        if format_.detect(template):
            return format_
    raise ValueError(f"tool_format=auto found no tool-call format in the tokenizer's chat "
                     f"template (known: {', '.join(TOOL_FORMATS)}); name one")


def turn_text(ids: Sequence[int], tokenizer: Any, keep: Sequence[str] = ()) -> str:
    """A turn's text as formats parse it: special tokens kept, its trailing special tokens
    (the end of turn the engine stopped at) removed, except the last when its text is one of
    ``keep`` (a format's ``ends``)."""
    special = set(getattr(tokenizer, "all_special_ids", ()) or ())
    end = len(ids)
    while end and ids[end - 1] in special:
        end -= 1
    if end < len(ids) and keep and tokenizer.decode([ids[end]]) in keep:
        end += 1
    return tokenizer.decode(list(ids[:end]), skip_special_tokens=False)


class ToolEnvironment:
    """An environment whose model calls typed tools in its chat template's format.

    ``reset`` returns the sample's prompt as chat messages (``system`` first when given), so
    graft-multiturn renders it with the tool list (``tools``); ``step`` parses the turn with
    ``tool_format``: no call is the final answer (`finish`: done, scored by the configured
    reward), calls are run (at most ``max_calls`` per episode: a call past them ends the
    episode) and answered with ``tool`` messages; a call that does not parse or fit its tool is
    a `MalformedAction`. ``stop_after_call`` ends a turn at the format's ``call_end`` (one call
    per turn). Subclasses override `prompt`, `finish` and `reward`.
    """

    def __init__(self, tools: Sequence[Tool | Callable[..., Any]], *, tokenizer: Any,
                 tool_format: str | ToolFormat = "auto", max_calls: int | None = None,
                 system: str | None = None, stop_after_call: bool = False) -> None:
        self.toolbox = {t.name: t for t in (x if isinstance(x, Tool) else Tool(x) for x in tools)}
        self.tokenizer = tokenizer
        self.tool_format = resolve_tool_format(tool_format, tokenizer) if isinstance(
            tool_format, str) else tool_format
        self.max_calls, self.system = max_calls, system
        end = self.tool_format.call_end
        self.stop = (end,) if stop_after_call and end else ()
        self.calls = 0

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The schemas the chat template's ``tools`` argument gets."""
        return [t.schema for t in self.toolbox.values()]

    def prompt(self, sample: Any) -> list[dict[str, Any]]:
        """The episode's first messages: the sample's prompt as a user message (its messages
        when it is a conversation)."""
        prompt = getattr(sample, "prompt", sample)
        messages = list(prompt) if isinstance(prompt, list) else [
            {"role": "user", "content": str(prompt)}]
        return ([{"role": "system", "content": self.system}] if self.system else []) + messages

    def reset(self, sample: Any) -> Observation:
        self.calls = 0
        return self.prompt(sample)

    def finish(self, turn: ParsedTurn) -> tuple[Observation | None, float | None, bool]:
        """A turn without a call: done, the configured reward scores the episode."""
        return None, None, True

    def reward(self, calls: list[ToolCall], results: list[str]) -> float | None:
        """This turn's reward for its calls (None: none)."""
        return None

    def step(self, action_ids: list[int], action_text: str
             ) -> tuple[Observation | None, float | None, bool]:
        turn = self.tool_format.parse(turn_text(action_ids, self.tokenizer,
                                                keep=getattr(self.tool_format, "ends", ())))
        if turn.errors:
            raise MalformedAction(turn.errors[0])
        if not turn.calls:
            return self.finish(turn)
        if self.max_calls is not None and self.calls + len(turn.calls) > self.max_calls:
            return None, None, True
        results = []
        for call in turn.calls:
            if call.name not in self.toolbox:
                raise MalformedAction(f"no tool {call.name!r} (tools: "
                                      f"{', '.join(self.toolbox)})")
            results.append(self.toolbox[call.name].call(call.arguments))
        self.calls += len(turn.calls)
        messages = [{"role": "tool", "name": c.name, "content": r}
                    for c, r in zip(turn.calls, results, strict=True)]
        return messages, self.reward(turn.calls, results), False


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
