"""The built-in character tokenizer used with presets (no files, no downloads).

Ids: 0 ``<pad>``, 1 ``<bos>``, 2 ``<eos>``, 3 ``<unk>``, then printable ASCII and newline (100
ids in all; presets have a vocabulary of 128). It is a real `PreTrainedTokenizerFast`, so it
saves with ``save_pretrained`` next to exported weights and loads in transformers and vLLM.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from graft.errors import ConfigError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
CHARACTERS = tuple(chr(code) for code in range(32, 127)) + ("\n",)


@lru_cache(maxsize=1)
def builtin_tokenizer() -> PreTrainedTokenizerBase:
    """A character-level tokenizer: one id per character."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS + CHARACTERS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<bos>", eos_token="<eos>",
                                   pad_token="<pad>", unk_token="<unk>")


def tokenizer_dir(path: str) -> Path:
    """The ``data.tokenizer`` directory: it must exist. Cheap (no transformers import):
    ``graft train`` checks it before launching ranks."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        problem = "is not a directory" if folder.exists() else "does not exist"
        raise ConfigError(f"data.tokenizer {path!r} {problem}; set it to a local directory with "
                          f"tokenizer files, or leave it unset to use the model directory's")
    return folder


# Names of the files a tokenizer is read from (transformers' fast and slow tokenizers).
TOKENIZER_FILES = ("tokenizer*", "vocab.*", "merges.txt", "*.model", "*.tiktoken")
FIX = "set data.tokenizer to a local directory with the model's tokenizer files"


def tokenizer_source(path: str | None, model_path: str | None) -> Path | None:
    """The directory the run's tokenizer is read from (``data.tokenizer``, else ``model.path``);
    `ConfigError` when it holds no tokenizer files. None for the built-in tokenizer. Cheap (no
    transformers import): ``graft train`` checks it before launching ranks."""
    if path:
        folder, key = tokenizer_dir(path), "data.tokenizer"
    elif model_path:
        folder, key = Path(model_path).expanduser(), "model.path"
    else:
        return None
    if folder.is_dir() and not any(next(folder.glob(pattern), None) for pattern in TOKENIZER_FILES):
        unset = ", and data.tokenizer is unset" if key == "model.path" else ""
        raise ConfigError(f"{key} {str(folder)!r} has no tokenizer files (tokenizer.json, "
                          f"tokenizer_config.json, vocab.json...){unset}; {FIX}, e.g. `hf download "
                          f"MODEL_ID --include 'tokenizer*' 'vocab*' 'merges.txt' --local-dir DIR`")
    return folder


def load_tokenizer(path: str | None, model_path: str | None) -> PreTrainedTokenizerBase:
    """``data.tokenizer`` if set, else the model directory's tokenizer, else the built-in one.

    `ConfigError` when the directory holds no tokenizer, or one without a single ordinary token
    (what transformers builds for a model directory without tokenizer files)."""
    if tokenizer_source(path, model_path) is None:
        return builtin_tokenizer()
    from transformers import AutoTokenizer

    source = path or model_path
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load a tokenizer from {source!r}: {exc}. Set data.tokenizer to "
                          f"a local directory with tokenizer files") from exc
    count = len(tokenizer)
    if count <= len(set(tokenizer.all_special_ids)):
        special = ", ".join(tokenizer.all_special_tokens)
        raise ConfigError(f"the tokenizer read from {source!r} has {count} token"
                          f"{'s' if count != 1 else ''}, all special ({special}): it cannot "
                          f"encode text; {FIX}")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
