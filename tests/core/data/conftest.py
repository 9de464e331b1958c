"""Fixtures for data tests: a local chat checkpoint (BPE tokenizer with Qwen's chat template, a
tiny random Qwen3) and math datasets in verl's and TRL's layouts, all made here
(`graft.testing.chat`; other test folders build the same with those functions)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from graft.testing.chat import gsm8k_rows, write_chat_checkpoint, write_verl_parquet


@pytest.fixture(scope="session")
def chat_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Hugging Face directory: tiny random Qwen3 + BPE tokenizer with a chat template."""
    return write_chat_checkpoint(tmp_path_factory.mktemp("chat-model") / "qwen3-chat")


@pytest.fixture(scope="session")
def chat_tokenizer(chat_checkpoint: Path) -> Any:
    """The checkpoint's tokenizer, loaded as a run loads it."""
    from graft.data.tokenizer import load_tokenizer

    return load_tokenizer(None, str(chat_checkpoint))


@pytest.fixture
def verl_gsm8k(tmp_path: Path) -> Path:
    """Eight GSM8K-style problems in verl's RL parquet layout."""
    return write_verl_parquet(tmp_path / "train.parquet", gsm8k_rows(8))
