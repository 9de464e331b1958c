"""graft.testing's local chat checkpoint: Qwen's template, another given, or none."""

from __future__ import annotations

from pathlib import Path

import pytest

from graft.testing import write_chat_checkpoint
from graft.testing.chat import CHAT_TEMPLATE

SHOUT = "{%- for message in messages %}{{- message['content'] | upper }}{%- endfor %}"


@pytest.mark.parametrize(("chat_template", "saved"), [(True, CHAT_TEMPLATE), (SHOUT, SHOUT),
                                                      (False, None)])
def test_the_checkpoint_saves_the_chat_template_asked_for(tmp_path: Path, chat_template,
                                                          saved) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(
        write_chat_checkpoint(tmp_path, chat_template=chat_template))
    assert tokenizer.chat_template == saved
    if saved == SHOUT:
        assert tokenizer.apply_chat_template([{"role": "user", "content": "hi"}],
                                             tokenize=False) == "HI"
