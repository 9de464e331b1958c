"""Episodes in the chat template's own format: a trajectory built token by token with a checked
contract (no torch).

The trainer's ids are the ids the model generated plus the template's rendering of each
observation (``tool``/``user`` messages) and of the next generation prompt, appended turn by
turn; model output is never tokenised again. After each observation `ChatTrajectory.observe`
renders the whole conversation so far (the assistant turns as their `graft_multiturn.tools`
format reads them back) and checks that it starts with the ids built so far:

* it does (an append-only template): what the rendering adds past them is appended, the
  end of a turn the engine cut (a ``stop`` string, ``max_new_tokens``) included, so the
  sequence is token for token the template's;
* it does not (a thinking template that drops earlier ``<think>`` blocks; a model whose tool
  call the template writes differently): a *prefix break*, counted
  (``multiturn/prefix_breaks``). ``features.multiturn.on_prefix_break=keep`` (the default)
  keeps the history as the model saw it: the turn is closed with the template's end-of-turn
  tokens where it lacks them, then the observation as the template renders it after an
  assistant turn; later turns are not checked again. ``resegment`` replaces the sequence
  with the template's rendering of the whole conversation, a new segment the model continues
  from, whose tokens so far are not trained (loss mask 0).

Tokens the template adds (end of turn, observations, generation prompts) are never the
model's: loss mask 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

SENTINEL = "GRAFT-SENTINEL"
# what an observation follows: a user's question and an assistant's turn (rendered the same
# with and without the observation, so the difference is the observation's rendering)
BASE = ({"role": "user", "content": "question"}, {"role": "assistant", "content": SENTINEL})
ON_PREFIX_BREAK = ("keep", "resegment")


class TemplateError(ValueError):
    """The tokenizer cannot render chat messages (no chat template, or one that fails)."""


def is_messages(value: Any) -> bool:
    """Whether ``value`` is a non-empty list of chat messages (mappings with a ``role``)."""
    return isinstance(value, list | tuple) and bool(value) and all(
        isinstance(m, Mapping) and "role" in m for m in value)


class ChatTemplate:
    """The tokenizer's chat template with a tool list (``tools``: schemas, or None)."""

    def __init__(self, tokenizer: Any, tools: Sequence[Mapping[str, Any]] | None = None) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise TemplateError("chat messages need a tokenizer with a chat template; return "
                                "text or token ids instead")
        self.tokenizer = tokenizer
        self.tools = [dict(t) for t in tools] if tools else None
        self.special = set(getattr(tokenizer, "all_special_ids", ()) or ())
        self._end: list[int] | None = None

    def text(self, messages: Sequence[Mapping[str, Any]], *, generation: bool) -> str:
        """The template's rendering of ``messages`` (with the next assistant header when
        ``generation``)."""
        try:
            return self.tokenizer.apply_chat_template(
                [dict(m) for m in messages], tools=self.tools, tokenize=False,
                add_generation_prompt=generation)
        except Exception as exc:  # jinja's errors: the template refuses these messages
            raise TemplateError(f"the chat template cannot render {_roles(messages)}: "
                                f"{type(exc).__name__}: {exc}") from exc

    def encode(self, text: str) -> list[int]:
        """``text`` (a rendering, or a piece of one) as token ids, no tokens added."""
        return [int(t) for t in self.tokenizer(text, add_special_tokens=False)["input_ids"]]

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def prompt_ids(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """The episode's prompt: ``messages`` rendered with the tools and the generation
        prompt."""
        return self.encode(self.text(messages, generation=True))

    def observation_ids(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """``messages`` (tool or user) as the template renders them after an assistant turn,
        with the next generation prompt: the rendering of `BASE` + ``messages`` past that of
        `BASE` alone (a template that opens a conversation with a default system prompt or
        groups consecutive tool messages renders them in place). Rendered alone where the
        template does not append them to `BASE`."""
        base = self.text(BASE, generation=False)
        full = self.text([*BASE, *messages], generation=True)
        if full.startswith(base):
            return self.encode(full[len(base):])
        return self.encode(self.text(messages, generation=True))

    def end_of_turn(self) -> list[int]:
        """The ids the template writes after an assistant message's content (ChatML's
        ``<|im_end|>`` and newline)."""
        if self._end is None:
            text = self.text(BASE, generation=False)
            self._end = self.encode(text[text.rindex(SENTINEL) + len(SENTINEL):])
        return self._end

    def close(self, turn: Sequence[int]) -> list[int]:
        """What closes a model turn: the template's end-of-turn ids it did not generate
        (none after a turn that ended with them, the rest after one that ended with their
        first ids; none after any other special token, such as a harmony ``<|call|>``)."""
        end, turn = self.end_of_turn(), list(turn)
        for overlap in range(min(len(end), len(turn)), 0, -1):
            if turn[-overlap:] == end[:overlap]:
                return end[overlap:]
        return [] if turn and turn[-1] in self.special else list(end)


@dataclass(frozen=True)
class Appended:
    """What `ChatTrajectory.observe` adds: ``ids`` after the sequence (template tokens, mask
    0), or with ``resegment`` the whole new sequence (prompt and response) that replaces it."""

    ids: list[int]
    resegment: bool = False


class ChatTrajectory:
    """One episode's conversation on a chat template: the messages so far, the prompt's ids,
    and the prefix breaks found (`observe`)."""

    def __init__(self, template: ChatTemplate, messages: Sequence[Mapping[str, Any]], *,
                 on_prefix_break: str = "keep") -> None:
        if on_prefix_break not in ON_PREFIX_BREAK:
            raise ValueError(f"on_prefix_break={on_prefix_break!r}: one of {ON_PREFIX_BREAK}")
        self.template, self.on_prefix_break = template, on_prefix_break
        self.messages = [dict(m) for m in messages]
        self.prompt_ids = template.prompt_ids(self.messages)
        self.checked = True  # the messages still render to the ids built (no break kept)
        self.breaks = 0

    def untracked(self) -> None:
        """An observation that is not messages (text, ids) was appended: the conversation no
        longer describes the sequence, and later turns are not checked."""
        self.checked = False

    def observe(self, built: Sequence[int], turn: Sequence[int], assistant: Mapping[str, Any],
                observation: Sequence[Mapping[str, Any]]) -> Appended:
        """After the model's turn ``turn`` (the last ids of ``built``, the sequence so far, and
        ``assistant``, the message its format reads from it) and the environment's
        ``observation`` messages: what to append (module docstring)."""
        self.messages += [dict(assistant), *(dict(m) for m in observation)]
        built = list(built)
        if self.checked:
            text = self.template.text(self.messages, generation=True)
            full = self.template.encode(text)
            if full[:len(built)] == built:
                return Appended(full[len(built):])
            shown = self.template.decode(built)  # the same text, the model's own token split
            if text.startswith(shown):
                return Appended(self.template.encode(text[len(shown):]))
            self.breaks += 1
            if self.on_prefix_break == "resegment":
                return Appended(full, resegment=True)
            self.checked = False
        return Appended(self.template.close(turn) + self.template.observation_ids(observation))


def _roles(messages: Sequence[Mapping[str, Any]]) -> str:
    return "messages of roles " + ", ".join(str(m.get("role")) for m in messages)
