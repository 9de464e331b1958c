"""SFT on chat data: a conversation's token ids and which of them the loss covers.

A conversation is a context (the messages not trained on: TRL's conversational ``prompt``, or a
``messages`` list up to its first assistant turn) and a completion (the messages after it). The
loss covers the completion's assistant turns, each through its end-of-turn token, and nothing
else: not system, user or tool messages, not the template's role headers, not the whitespace a
template writes after an end-of-turn token (Qwen's newline after ``<|im_end|>``). This is TRL's
``assistant_only_loss``, restricted to the completion as TRL's ``completion_only_loss`` is.

With ``{% generation %}`` markers in the template the mask is the template's own (transformers'
``return_assistant_tokens_mask``, as TRL reads it). Otherwise the conversation is rendered
incrementally: for each assistant turn, the conversation before it with the generation prompt
(the turn's header) and the conversation through it. Both must tokenize to prefixes of the
whole conversation's ids; a template that rewrites earlier turns (one that drops their
reasoning, say) is a `DataError` naming the record. A turn's tokens between the two are trained
up to its last special token when only whitespace follows it (the end of the turn), else all.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from graft.errors import DataError

if TYPE_CHECKING:
    from graft.data.prompts import PromptEncoder
    from graft.data.tasks import Messages

ASSISTANT = "assistant"
GENERATION_MARKER = re.compile(r"\{%-?\s*generation\s*-?%\}")


def first_assistant_turn(messages: Sequence[dict[str, Any]]) -> int | None:
    """The index of the first assistant message, or None when there is none."""
    return next((i for i, m in enumerate(messages) if m.get("role") == ASSISTANT), None)


def special_ids(tokenizer: Any) -> set[int]:
    """The ids of the tokenizer's special tokens: its named ones (eos, pad, ...) and every
    added token marked special (chat templates' turn markers such as ``<|im_end|>``)."""
    ids = set(tokenizer.all_special_ids)
    decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    ids.update(i for i, token in decoder.items() if getattr(token, "special", False))
    return ids


class ConversationEncoder:
    """Token ids and the assistant-turn loss mask of conversations, under a `PromptEncoder`'s
    tokenizer and template (``data.chat_template``)."""

    def __init__(self, prompts: PromptEncoder) -> None:
        self.prompts = prompts
        self.tokenizer = prompts.tokenizer
        self.special = special_ids(self.tokenizer)
        template = prompts.override or getattr(self.tokenizer, "chat_template", None) or ""
        self.marked = isinstance(template, str) and bool(GENERATION_MARKER.search(template))

    def encode(self, context: Messages, completion: Messages, *, context_ids: Sequence[int],
               origin: str) -> tuple[list[int], list[int]]:
        """The ids of ``context + completion`` and a 0/1 per id: 1 on the completion's
        assistant turns. ``context_ids`` are the context's ids with the generation prompt
        (`PromptEncoder.encode`); they must start the conversation's ids. ``origin`` names the
        record in errors."""
        if not self.prompts.templated:
            raise DataError(f"{origin}: the completion is a list of chat messages, but "
                            f"{self.prompts.why_no_template()}; set data.chat_template to a "
                            f"Jinja file")
        messages = [*context, *completion]
        ids, marks = self._render(messages, origin, marks=self.marked)
        self._check_prefix(ids, context_ids, origin, "the context with its generation prompt")
        if marks is not None:
            mask = [int(bool(m)) if i >= len(context_ids) else 0 for i, m in enumerate(marks)]
        else:
            mask = [0] * len(ids)
            for turn in range(len(context), len(messages)):
                if messages[turn].get("role") == ASSISTANT:
                    start, end = self._turn_span(messages, turn, ids, origin)
                    mask[start:end] = [1] * (end - start)
        if not any(mask):
            raise DataError(f"{origin}: the completion has no assistant turn to train on (the "
                            f"loss covers assistant messages only)")
        return ids, mask

    def _turn_span(self, messages: Messages, turn: int, ids: list[int],
                   origin: str) -> tuple[int, int]:
        """Where assistant turn ``turn`` sits in ``ids``: after its header, through its
        end-of-turn token."""
        before = self._render(messages[:turn], origin, generation_prompt=True)[0]
        through = self._render(messages[:turn + 1], origin)[0]
        what = f"the conversation before assistant turn {turn + 1}"
        self._check_prefix(ids, before, origin, what)
        self._check_prefix(ids, through, origin, f"the conversation through message {turn + 1}")
        start, end = len(before), len(through)
        last = next((i for i in range(end - 1, start - 1, -1) if ids[i] in self.special), None)
        if last is not None and not self.tokenizer.decode(ids[last + 1:end]).strip():
            end = last + 1  # template whitespace after the end of the turn is not the model's
        return start, end

    def _render(self, messages: Messages, origin: str, *, generation_prompt: bool = False,
                marks: bool = False) -> tuple[list[int], list[int] | None]:
        try:
            encoded: Any = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=generation_prompt, tokenize=True,
                return_dict=True, return_assistant_tokens_mask=marks,
                chat_template=self.prompts.override)
        except Exception as exc:  # noqa: BLE001 - jinja raises its own errors (and templates raise_exception)
            raise DataError(f"{origin}: the chat template cannot render this conversation: "
                            f"{type(exc).__name__}: {exc}") from exc
        ids = list(encoded["input_ids"])
        return ids, (list(encoded["assistant_masks"]) if marks else None)

    @staticmethod
    def _check_prefix(ids: list[int], prefix: Sequence[int], origin: str, what: str) -> None:
        if list(ids[:len(prefix)]) != list(prefix):
            raise DataError(f"{origin}: the chat template renders {what} differently from the "
                            f"start of the whole conversation (it rewrites earlier turns), so "
                            f"the assistant turns cannot be found; give data.chat_template a "
                            f"template that renders turns the same wherever they are, or one "
                            f"with {{% generation %}} markers around the assistant's text")
