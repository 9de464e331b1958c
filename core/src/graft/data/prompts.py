"""Prompt token ids: text as it is, chat messages through the chat template.

``data.chat_template``: ``auto`` uses the tokenizer's template when it has one; ``none`` uses
none; anything else is the path of a Jinja file used instead of the tokenizer's. Chat messages
are rendered with the generation prompt (the assistant's header), exactly as
``tokenizer.apply_chat_template(messages, add_generation_prompt=True)`` tokenizes them; the
template places any special tokens itself. A plain-text prompt is tokenized as it is, with the
tokenizer's ``bos`` first when it has one, whatever the template setting: this is TRL's
"standard" format (its "conversational" format, a list of messages, is the one templated), and
verl's datasets hold messages only. Write prompts as ``[{"role": "user", "content": text}]`` to
have them templated. Messages without a template are an error, never their Python repr.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from graft.errors import ConfigError, DataError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from graft.data.tasks import Messages

AUTO, NONE = "auto", "none"


def read_chat_template(setting: str) -> str:
    """The Jinja text of ``data.chat_template=<path>``; a `ConfigError` if it is no file."""
    file = Path(setting).expanduser()
    if not file.is_file():
        raise ConfigError(f"data.chat_template={setting!r} is neither auto, none nor a Jinja "
                          f"file (no such file); give the path of a chat template file, auto "
                          f"(the tokenizer's) or none")
    return file.read_text(encoding="utf-8")


class PromptEncoder:
    """Turns prompts into token ids for ``tokenizer`` under ``data.chat_template``."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, chat_template: str = AUTO) -> None:
        self.tokenizer = tokenizer
        self.setting = chat_template
        # The template passed to apply_chat_template (None: the tokenizer's own).
        self.override = None if chat_template in (AUTO, NONE) else read_chat_template(chat_template)
        has_own = getattr(tokenizer, "chat_template", None) is not None
        self.templated = self.override is not None or (chat_template == AUTO and has_own)

    def encode(self, prompt: str | Messages, origin: str) -> list[int]:
        """The ids of one prompt (``origin`` names it in errors)."""
        if isinstance(prompt, str):
            ids = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
            bos = self.tokenizer.bos_token_id
            return ids if bos is None else [bos, *ids]
        if not self.templated:
            raise DataError(f"{origin}: the prompt is a list of chat messages, but "
                            f"{self.why_no_template()}; set data.chat_template to a Jinja "
                            f"file, or give prompts as text")
        try:
            encoded: Any = self.tokenizer.apply_chat_template(
                prompt, add_generation_prompt=True, tokenize=True, return_dict=True,
                chat_template=self.override)
        except Exception as exc:  # noqa: BLE001 - jinja raises its own errors (and templates raise_exception)
            raise DataError(f"{origin}: the chat template cannot render this prompt: "
                            f"{type(exc).__name__}: {exc}") from exc
        return list(encoded["input_ids"])

    def why_no_template(self) -> str:
        """Why chat messages cannot be templated (for errors): the setting, or a tokenizer
        without a template."""
        if self.setting == NONE:
            return "data.chat_template=none"
        name = getattr(self.tokenizer, "name_or_path", "") or "the built-in one"
        return (f"the tokenizer ({name}) has no chat template (data.chat_template=auto)")
