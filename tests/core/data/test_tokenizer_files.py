"""A tokenizer source without tokenizer files, or a tokenizer that cannot encode text, is a
`ConfigError` naming ``data.tokenizer`` (issue 36, finding 8: transformers built a 1-token
tokenizer for a Qwen3 directory without them; text data then failed with an ``IndexError`` in
``generate`` and chat data blamed the chat template)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from graft.data.tokenizer import load_tokenizer
from graft.errors import ConfigError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja", "vocab.json", "merges.txt")


@pytest.fixture
def without_tokenizer(chat_checkpoint: Path, tmp_path: Path) -> Path:
    """The chat checkpoint's model (config.json, weights) without its tokenizer files."""
    folder = tmp_path / "model"
    shutil.copytree(chat_checkpoint, folder)
    for name in TOKENIZER_FILES:
        (folder / name).unlink(missing_ok=True)
    return folder


def test_a_model_directory_without_tokenizer_files(without_tokenizer: Path,
                                                   chat_checkpoint: Path) -> None:
    with pytest.raises(ConfigError, match=r"model.path .* has no tokenizer files .*and "
                                          r"data.tokenizer is unset; set data.tokenizer"):
        load_tokenizer(None, str(without_tokenizer))
    tokenizer = load_tokenizer(str(chat_checkpoint), str(without_tokenizer))  # the fix
    assert len(tokenizer("Repeat the number", add_special_tokens=False)["input_ids"]) > 1


def test_a_tokenizer_folder_without_tokenizer_files(tmp_path: Path) -> None:
    (tmp_path / "tok").mkdir()
    with pytest.raises(ConfigError, match=r"data.tokenizer .* has no tokenizer files"):
        load_tokenizer(str(tmp_path / "tok"), None)


def test_a_tokenizer_without_ordinary_tokens_is_refused(without_tokenizer: Path) -> None:
    """A tokenizer_config.json without vocabulary files: transformers' 1-token tokenizer."""
    (without_tokenizer / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "Qwen2Tokenizer"}))
    with pytest.raises(ConfigError, match=r"has 1 token, all special.*set data.tokenizer"):
        load_tokenizer(None, str(without_tokenizer))
