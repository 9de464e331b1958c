"""From ``cfg.data`` to token samples: synthetic tasks or files, tokenized with length checks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from graft.data.files import read_records, records_to_samples
from graft.data.tasks import TASKS, TextSample, generate_samples
from graft.engine.micro_batch import TokenSample
from graft.errors import ConfigError, DataError, did_you_mean

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from graft.config.schema import DataConfig


def load_text_samples(data: DataConfig, *, seed: int, require_response: bool) -> list[TextSample]:
    """The dataset's samples: ``data.source`` is a task name, or ``file`` to read ``data.path``."""
    if data.source == "file":
        if not data.path:
            raise ConfigError("data.source=file needs data.path (a .jsonl or .parquet file)")
        return records_to_samples(read_records(data.path), prompt_key=data.prompt_key,
                                  response_key=data.response_key,
                                  answer_key=data.answer_key, require_response=require_response)
    if data.source not in TASKS:
        raise ConfigError(f"data.source={data.source!r} is neither 'file' nor a built-in task."
                          f"{did_you_mean(data.source, TASKS)} Tasks: {', '.join(TASKS)}.")
    return generate_samples(data.source, data.num_samples, seed)


def encode_prompt(text: str, tokenizer: PreTrainedTokenizerBase, *, max_tokens: int,
                  index: int, origin: str = "") -> list[int]:
    """``bos`` + prompt ids; a prompt over ``max_tokens`` is a `DataError` naming the sample.

    The error names ``origin`` (the file and 1-based line of file data, see
    `graft.data.tasks.TextSample`) when given, else ``sample <index>`` (0-based).
    """
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if tokenizer.bos_token_id is not None:
        ids = [tokenizer.bos_token_id, *ids]
    if len(ids) > max_tokens:
        raise DataError(f"{origin or f'sample {index}'}: the prompt has {len(ids)} tokens, more "
                        f"than data.max_prompt_tokens={max_tokens}; raise it or shorten the "
                        f"prompt")
    return ids


def encode_prompts(samples: Sequence[TextSample], tokenizer: PreTrainedTokenizerBase, *,
                   max_tokens: int) -> list[list[int]]:
    """`encode_prompt` for every sample, errors naming its file and line for file data."""
    return [encode_prompt(s.prompt, tokenizer, max_tokens=max_tokens, index=i, origin=s.origin)
            for i, s in enumerate(samples)]


def tokenize_sft(samples: Sequence[TextSample], tokenizer: PreTrainedTokenizerBase, *,
                 max_prompt_tokens: int, max_response_tokens: int) -> list[TokenSample]:
    """Prompt and response (+ ``eos``) ids; the loss covers the response."""
    out = []
    for index, sample in enumerate(samples):
        prompt = encode_prompt(sample.prompt, tokenizer, max_tokens=max_prompt_tokens, index=index,
                               origin=sample.origin)
        response = tokenizer(sample.response, add_special_tokens=False)["input_ids"]
        response = [*response, tokenizer.eos_token_id]
        if len(response) > max_response_tokens:
            raise DataError(f"{sample.origin or f'sample {index}'}: the response has "
                            f"{len(response)} tokens, more than "
                            f"data.max_response_tokens={max_response_tokens}")
        out.append(TokenSample(prompt + response, len(prompt)))
    return out
