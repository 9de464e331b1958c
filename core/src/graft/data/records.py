"""From dataset records to samples: keys by dotted path, chat prompts checked, the answer found.

Reads our JSONL (``prompt``, ``response``, ``answer``), verl's RL parquet (``prompt`` as chat
messages, ``reward_model.ground_truth``, ``data_source``, ``extra_info``) and TRL's layout
(``prompt`` as text or messages, ``solution`` / ``answer``) without conversion. Every error names
the file and the 1-based line or row of the record.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from graft.data.files import Record
from graft.data.tasks import Messages, TextSample
from graft.errors import DataError

# data.answer_key=auto: the first of these a record has (verl, TRL, ours, then the response).
AUTO_ANSWER_KEYS = ("reward_model.ground_truth", "solution", "answer", "response")
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
    if isinstance(value, (list, tuple)) and value:
        for position, message in enumerate(value, start=1):
            if not (isinstance(message, dict) and isinstance(message.get("role"), str)
                    and isinstance(message.get("content"), str)):
                raise DataError(f"{record.location}: {key!r} is a list, but its item {position} "
                                f"is not a chat message {{'role': text, 'content': text}}: "
                                f"{_short(message)}")
        return [dict(message) for message in value]
    raise DataError(f"{record.location}: {key!r} must be text or a list of chat messages "
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


def records_to_samples(records: Sequence[Record], *, prompt_key: str, response_key: str,
                       answer_key: str | None, require_response: bool,
                       require_answer: bool = False,
                       settings: tuple[str, str, str] = ("data.prompt_key", "data.response_key",
                                                         "data.answer_key")) -> list[TextSample]:
    """One sample per record: the prompt (text or chat messages), the response (when
    ``require_response``, else "" if absent), the answer (`read_answer`), ``data_source`` and
    ``extra_info``. ``settings`` are the config keys named in errors for the three keys. Each
    sample's ``origin`` is its record's location."""
    prompt_setting, response_setting, answer_setting = settings
    samples = []
    for number, record in enumerate(records, start=1):
        prompt = read_key(record.fields, prompt_key)
        if prompt is MISSING:
            raise missing_key(record, number, prompt_key, prompt_setting)
        response = read_key(record.fields, response_key)
        if response is MISSING:
            if require_response:
                raise missing_key(record, number, response_key, response_setting)
            response = ""
        elif not isinstance(response, str):
            raise DataError(f"{record.location}: {response_key!r} must be text, got "
                            f"{_short(response)}")
        answer = read_answer(record, number, answer_key, required=require_answer,
                             setting=answer_setting)
        source = read_key(record.fields, DATA_SOURCE_KEY)
        extra = read_key(record.fields, EXTRA_INFO_KEY)
        samples.append(TextSample(
            check_prompt(prompt, record, prompt_key), response, answer, origin=record.location,
            data_source="" if source is MISSING else str(source),
            extra_info=extra if isinstance(extra, dict) else None))
    return samples
