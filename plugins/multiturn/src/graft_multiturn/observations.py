"""An environment's observation as token ids (`graft_multiturn.environment` says what it may
be).

Only the observation itself is tokenised, never the sequence it is appended to: the episode's
earlier tokens stay exactly as they were generated or rendered.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class MalformedObservation(ValueError):
    """An observation that is none of ids, text or chat messages, or holds ids outside the
    vocabulary."""


def observation_ids(observation: Any, tokenizer: Any) -> list[int]:
    """The token ids of ``observation`` (empty for None or an empty one)."""
    if observation is None:
        return []
    if isinstance(observation, str):
        return list(tokenizer(observation, add_special_tokens=False)["input_ids"])
    if isinstance(observation, list | tuple) and all(isinstance(m, Mapping) for m in observation):
        return _template_ids(list(observation), tokenizer) if observation else []
    if isinstance(observation, list | tuple) and all(_is_id(t) for t in observation):
        ids = [int(t) for t in observation]
        vocabulary = len(tokenizer)
        outside = [t for t in ids if not 0 <= t < vocabulary]
        if outside:
            raise MalformedObservation(f"token ids {outside[:5]} are outside the tokenizer's "
                                       f"vocabulary of {vocabulary}")
        return ids
    raise MalformedObservation(f"the observation {repr(observation)[:80]} is neither token "
                               f"ids, text nor chat messages")


def _is_id(token: Any) -> bool:
    return isinstance(token, int) and not isinstance(token, bool) or (
        hasattr(token, "__index__") and not isinstance(token, bool | float | str))


def _template_ids(messages: list[Mapping[str, Any]], tokenizer: Any) -> list[int]:
    """Messages rendered by the chat template as it renders them after an assistant turn
    (`graft_multiturn.chat.ChatTemplate.observation_ids`), ending with the next assistant
    turn's header."""
    from graft_multiturn.chat import ChatTemplate, TemplateError

    try:
        return ChatTemplate(tokenizer).observation_ids(messages)
    except TemplateError as exc:
        raise MalformedObservation(str(exc)) from exc
