"""From dataset records to samples: keys by dotted path, chat prompts checked, the answer found.

Reads our JSONL (``prompt``, ``response``, ``answer``), verl's RL parquet (``prompt`` as chat
messages, ``reward_model.ground_truth``, ``data_source``, ``extra_info``) and TRL's layouts
(``prompt`` as text or messages, ``solution`` / ``answer``) without conversion. For SFT
(`sft_records_to_samples`) also TRL's SFT layouts: ``prompt`` + ``completion`` (text, or both
chat messages), a conversation under ``messages``, or ``text`` alone. Every error names the file
and the 1-based line or row of the record.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from graft.data.conversations import first_assistant_turn
from graft.data.files import Record
from graft.data.tasks import Messages, TextSample
from graft.errors import DataError

# data.answer_key=auto: the first of these a record has (verl, TRL, ours, then the response).
AUTO_ANSWER_KEYS = ("reward_model.ground_truth", "solution", "answer", "response")
# data.response_key=auto: the first of these a record has (TRL's, ours).
AUTO_RESPONSE_KEYS = ("completion", "response")
AUTO = "auto"
# Fields carried with every sample when a record has them (verl's names).
DATA_SOURCE_KEY, EXTRA_INFO_KEY = "data_source", "extra_info"


class _Missing:
    """What `read_key` returns for a key that reads nothing."""


MISSING = _Missing()


def read_key(fields: dict[str, Any], key: str) -> Any:
    """``fields[key]``, or for a dotted key the nested value (``a.b`` is ``fields["a"]["b"]``);
    `MISSING` when it reads nothing (absent, or None). A key that is itself a column name
    (``"a.b"`` as one key) wins over the path."""
    if key in fields:
        return MISSING if fields[key] is None else fields[key]
    value: Any = fields
    for part in key.split("."):
        if not isinstance(value, dict) or value.get(part) is None:
            return MISSING
        value = value[part]
    return value


def _keys_at(fields: dict[str, Any], key: str) -> str:
    """What the record has where ``key`` stops reading: for ``a.b.c`` the keys of ``a.b`` (or of
    ``a``, or the record) with their path."""
    parts = key.split(".")
    value: Any = fields
    where = "it"
    for depth, part in enumerate(parts[:-1]):
        inner = value.get(part) if isinstance(value, dict) else None
        if not isinstance(inner, dict):
            break
        value, where = inner, repr(".".join(parts[:depth + 1]))
    keys = ", ".join(map(str, value)) if isinstance(value, dict) else "no keys"
    return f"{where} has: {keys}" if where == "it" else f"it has {where} with: {keys}"


def missing_key(record: Record, number: int, key: str, setting: str) -> DataError:
    """The error for a ``key`` (from config key ``setting``) that reads nothing in ``record``."""
    return DataError(f"{record.location}: record {number} has no {key!r} field "
                     f"({_keys_at(record.fields, key)}); set {setting} to the dataset's key "
                     f"(a dotted path reads a nested field: reward_model.ground_truth)")


def check_prompt(value: Any, record: Record, key: str) -> str | Messages:
    """``value`` as a prompt: text, or a non-empty list of chat messages (each a dict with
    text ``role`` and ``content``); anything else is a `DataError` naming the record."""
    if isinstance(value, str):
        return value
    return check_messages(value, record, key)


def check_messages(value: Any, record: Record, key: str) -> Messages:
    """``value`` as a non-empty list of chat messages (each a dict with text ``role`` and
    ``content``); anything else is a `DataError` naming the record."""
    if isinstance(value, (list, tuple)) and value:
        for position, message in enumerate(value, start=1):
            if not (isinstance(message, dict) and isinstance(message.get("role"), str)
                    and isinstance(message.get("content"), str)):
                raise DataError(f"{record.location}: {key!r} is a list, but its item {position} "
                                f"is not a chat message {{'role': text, 'content': text}}: "
                                f"{_short(message)}")
        return [dict(message) for message in value]
    kinds = "a list of chat messages" if isinstance(value, str) else (
        "text or a list of chat messages")
    raise DataError(f"{record.location}: {key!r} must be {kinds} "
                    f"[{{'role': ..., 'content': ...}}], got {_short(value)}")


def _short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def as_answer(value: Any) -> str:
    """An answer as text: text as it is, numbers as written, lists and dicts as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value, default=str)
    return str(value)


def read_answer(record: Record, number: int, key: str | None, *, required: bool,
                setting: str) -> str | None:
    """The record's answer under ``key``: None for ``key=None``; for ``auto`` the first of
    `AUTO_ANSWER_KEYS` the record has (none: an error when ``required``); any other key must
    read something."""
    if key is None:
        return None
    if key != AUTO:
        value = read_key(record.fields, key)
        if value is MISSING:
            raise missing_key(record, number, key, setting)
        return as_answer(value)
    for candidate in AUTO_ANSWER_KEYS:
        if (value := read_key(record.fields, candidate)) is not MISSING:
            return as_answer(value)
    if required:
        raise DataError(f"{record.location}: record {number} has none of the answer keys "
                        f"{setting}=auto looks for ({', '.join(AUTO_ANSWER_KEYS)}; it has: "
                        f"{', '.join(map(str, record.fields))}); set {setting} to the answer's "
                        f"key, or to null for a reward that needs no answer")
    return None


def read_response(record: Record, number: int, key: str, *, required: bool,
                  setting: str) -> tuple[str, Any]:
    """The key and the value of the record's response (or completion) under ``key``; for
    ``auto`` the first of `AUTO_RESPONSE_KEYS` the record has. The value is `MISSING` when it
    reads nothing, an error then when ``required``."""
    keys = AUTO_RESPONSE_KEYS if key == AUTO else (key,)
    for candidate in keys:
        if (value := read_key(record.fields, candidate)) is not MISSING:
            return candidate, value
    if not required:
        return key, MISSING
    if key != AUTO:
        raise missing_key(record, number, key, setting)
    raise DataError(f"{record.location}: record {number} has neither of the response keys "
                    f"{setting}=auto looks for ({', '.join(AUTO_RESPONSE_KEYS)}; it has: "
                    f"{', '.join(map(str, record.fields))}); set {setting} to the response's "
                    f"key")


def _sample(record: Record, prompt: str | Messages, response: str | Messages,
            answer: str | None) -> TextSample:
    """A sample of ``record`` with its ``data_source`` and ``extra_info``."""
    source = read_key(record.fields, DATA_SOURCE_KEY)
    extra = read_key(record.fields, EXTRA_INFO_KEY)
    return TextSample(prompt, response, answer, origin=record.location,
                      data_source="" if source is MISSING else str(source),
                      extra_info=extra if isinstance(extra, dict) else None)


def records_to_samples(records: Sequence[Record], *, prompt_key: str, response_key: str,
                       answer_key: str | None, require_response: bool,
                       require_answer: bool = False,
                       settings: tuple[str, str, str] = ("data.prompt_key", "data.response_key",
                                                         "data.answer_key")) -> list[TextSample]:
    """One sample per record: the prompt (text or chat messages), the response (when
    ``require_response``, else "" if absent or, under ``auto``, not text), the answer
    (`read_answer`), ``data_source`` and ``extra_info``. ``settings`` are the config keys named
    in errors for the three keys. Each sample's ``origin`` is its record's location."""
    prompt_setting, response_setting, answer_setting = settings
    samples = []
    for number, record in enumerate(records, start=1):
        prompt = read_key(record.fields, prompt_key)
        if prompt is MISSING:
            raise missing_key(record, number, prompt_key, prompt_setting)
        named, response = read_response(record, number, response_key,
                                        required=require_response, setting=response_setting)
        if response is MISSING or (response_key == AUTO and not require_response
                                   and not isinstance(response, str)):
            response = ""  # RL reads no completion: TRL's chat completions are left as they are
        elif not isinstance(response, str):
            raise DataError(f"{record.location}: {named!r} must be text, got "
                            f"{_short(response)}")
        answer = read_answer(record, number, answer_key, required=require_answer,
                             setting=answer_setting)
        samples.append(_sample(record, check_prompt(prompt, record, prompt_key), response,
                               answer))
    return samples


def sft_records_to_samples(records: Sequence[Record], *, prompt_key: str, response_key: str,
                           messages_key: str, text_key: str, answer_key: str | None,
                           prompt_setting: str = "data.prompt_key",
                           answer_setting: str = "data.answer_key") -> list[TextSample]:
    """One SFT sample per record, in the first layout the record has (TRL's, read as they
    are): ``prompt_key`` with a response (``response_key``; auto: ``completion`` or
    ``response``), text or, with a chat prompt, chat messages whose assistant turns are
    trained (the completion's messages before its first assistant turn join the prompt); a
    conversation under ``messages_key`` (the prompt is its messages before the first
    assistant turn, the response the rest); text under ``text_key`` (no prompt: every token is
    trained). None of them is a `DataError` naming the record, its keys and the settings."""
    samples = []
    for number, record in enumerate(records, start=1):
        prompt, response = _sft_parts(record, number, prompt_key=prompt_key,
                                      response_key=response_key, messages_key=messages_key,
                                      text_key=text_key, prompt_setting=prompt_setting)
        answer = read_answer(record, number, answer_key, required=False,
                             setting=answer_setting)
        samples.append(_sample(record, prompt, response, answer))
    return samples


def _sft_parts(record: Record, number: int, *, prompt_key: str, response_key: str,
               messages_key: str, text_key: str, prompt_setting: str
               ) -> tuple[str | Messages, str | Messages]:
    """The prompt and the response of one SFT record (`sft_records_to_samples`)."""
    fields = record.fields
    if (prompt := read_key(fields, prompt_key)) is not MISSING:
        prompt = check_prompt(prompt, record, prompt_key)
        named, response = read_response(record, number, response_key, required=True,
                                        setting="data.response_key")
        if isinstance(response, str):
            return prompt, response
        completion = check_messages(response, record, named)
        if isinstance(prompt, str):
            raise DataError(f"{record.location}: {named!r} is a list of chat messages but "
                            f"{prompt_key!r} is text; in TRL's conversational prompt-completion "
                            f"layout both are messages: give the prompt as "
                            f"[{{'role': 'user', 'content': ...}}]")
        first = first_assistant_turn(completion)
        if first is None:
            raise DataError(f"{record.location}: {named!r} has no assistant message to train "
                            f"on (SFT on chat data trains the assistant turns)")
        # Messages before the first trained turn are context: the prompt then ends where the
        # generation prompt (the assistant's header) follows.
        return [*prompt, *completion[:first]], completion[first:]
    if (messages := read_key(fields, messages_key)) is not MISSING:
        conversation = check_messages(messages, record, messages_key)
        first = first_assistant_turn(conversation)
        if first is None:
            raise DataError(f"{record.location}: {messages_key!r} has no assistant message to "
                            f"train on (SFT on chat data trains the assistant turns)")
        return conversation[:first], conversation[first:]
    if (text := read_key(fields, text_key)) is not MISSING:
        if not isinstance(text, str):
            raise DataError(f"{record.location}: {text_key!r} must be text, got {_short(text)}")
        return "", text
    raise DataError(f"{record.location}: record {number} has no {prompt_key!r} field "
                    f"({_keys_at(fields, prompt_key)}), nor {messages_key!r} or {text_key!r}: "
                    f"SFT reads a prompt with its response, a conversation (TRL's "
                    f"conversational layout) or text alone (language modeling); set "
                    f"{prompt_setting}, data.messages_key or data.text_key to the dataset's key")
