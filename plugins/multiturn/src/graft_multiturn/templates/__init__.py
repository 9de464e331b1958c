"""Chat templates that behave like the public families, to test an environment against each
without downloading a model: ``hermes`` (append-only Hermes/Qwen2.5-style ChatML, tools in the
system turn, ``<tool_call>{json}</tool_call>``), ``thinking`` (like Qwen3.5: earlier turns'
``<think>`` blocks dropped) and ``harmony`` (GPT-OSS-style channels)."""

from __future__ import annotations

from importlib.resources import files

FAMILIES = ("hermes", "thinking", "harmony")


def chat_template(family: str) -> str:
    """The Jinja chat template of ``family`` (one of `FAMILIES`), as a tokenizer's
    ``chat_template``."""
    if family not in FAMILIES:
        raise ValueError(f"no chat template {family!r}; the templates are {', '.join(FAMILIES)}")
    return files(__package__).joinpath(f"{family}.jinja").read_text()
