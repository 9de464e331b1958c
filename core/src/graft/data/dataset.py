"""From ``cfg.data`` to token samples: synthetic tasks or files, tokenized with length checks.

`load_prompts` (training, RL) and `load_validation_prompts` (``data.val_path``) give the
samples and their prompt ids; `tokenize_sft` gives SFT's prompt + response ids (for chat
completions, the conversation's ids with its assistant turns marked:
`graft.data.conversations`). Prompts longer than ``data.max_prompt_tokens`` are an error, or
with ``data.overlong_prompts=skip`` dropped (counted and logged; nothing left is an error).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from graft.data.conversations import ConversationEncoder
from graft.data.files import read_records, training_file
from graft.data.prompts import PromptEncoder
from graft.data.records import records_to_samples, sft_records_to_samples
from graft.data.tasks import TASKS, TextSample, generate_samples
from graft.engine.batch.micro_batch import TokenSample
from graft.errors import ConfigError, DataError, did_you_mean

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from graft.config.schema import DataConfig

logger = logging.getLogger("graft.data")

TRAIN, VAL = "train", "val"


@dataclass(frozen=True)
class Prompts:
    """Samples and the token ids of their prompts (``ids[i]`` is ``samples[i]``'s), and how
    many samples were skipped as overlong."""

    samples: list[TextSample]
    ids: list[list[int]]
    skipped: int = 0


def load_text_samples(data: DataConfig, *, seed: int, require_response: bool,
                      split: str = TRAIN) -> list[TextSample]:
    """The dataset's samples: ``data.source`` is a task name, or ``file`` to read ``data.path``.

    ``split="val"`` reads ``data.val_path`` with the ``data.val_*`` keys (unset: the training
    keys). RL (no ``require_response``) needs an answer per record (``data.answer_key``); SFT
    (``require_response``) reads TRL's SFT layouts too (`graft.data.records.
    sft_records_to_samples`).
    """
    if split == VAL:
        if not data.val_path:
            raise ConfigError("no held-out set: set data.val_path (a .jsonl or .parquet file)")
        return _file_samples(data.val_path, data, split=VAL, require_response=require_response)
    path = training_file(data)
    if path is not None:
        return _file_samples(path, data, split=TRAIN, require_response=require_response)
    if data.source not in TASKS:
        raise ConfigError(f"data.source={data.source!r} is neither 'file' nor a built-in task."
                          f"{did_you_mean(data.source, TASKS)} Tasks: {', '.join(TASKS)}.")
    return generate_samples(data.source, data.num_samples, seed)


def _file_samples(path: str, data: DataConfig, *, split: str,
                  require_response: bool) -> list[TextSample]:
    prefix = "data.val_" if split == VAL else "data."
    prompt_key, answer_key = data.prompt_key, data.answer_key
    if split == VAL:
        prompt_key = data.val_prompt_key or prompt_key
        answer_key = data.val_answer_key or answer_key
    if require_response:
        return sft_records_to_samples(
            read_records(path, setting=f"{prefix}path"), prompt_key=prompt_key,
            response_key=data.response_key, messages_key=data.messages_key,
            text_key=data.text_key, answer_key=answer_key, prompt_setting=f"{prefix}prompt_key",
            answer_setting=f"{prefix}answer_key")
    return records_to_samples(
        read_records(path, setting=f"{prefix}path"), prompt_key=prompt_key,
        response_key=data.response_key, answer_key=answer_key,
        require_response=require_response, require_answer=not require_response,
        settings=(f"{prefix}prompt_key", "data.response_key", f"{prefix}answer_key"))


def load_prompts(data: DataConfig, tokenizer: PreTrainedTokenizerBase, *, seed: int,
                 split: str = TRAIN) -> Prompts:
    """The RL prompts of ``split`` (``train``: ``data.source`` / ``data.path``; ``val``:
    ``data.val_path``), tokenized under ``data.chat_template`` and ``data.overlong_prompts``."""
    samples = load_text_samples(data, seed=seed, require_response=False, split=split)
    return encode_prompts(samples, tokenizer, max_tokens=data.max_prompt_tokens,
                          chat_template=data.chat_template, overlong=data.overlong_prompts)


def load_validation_prompts(data: DataConfig, tokenizer: PreTrainedTokenizerBase
                            ) -> Prompts | None:
    """The held-out prompts of ``data.val_path`` (None when it is unset), loaded like the
    training prompts."""
    if not data.val_path:
        return None
    return load_prompts(data, tokenizer, seed=0, split=VAL)


def _label(sample: TextSample, index: int) -> str:
    return sample.origin or f"sample {index}"


def _too_long(sample: TextSample, index: int, tokens: int, max_tokens: int) -> DataError:
    return DataError(f"{_label(sample, index)}: the prompt has {tokens} tokens, more than "
                     f"data.max_prompt_tokens={max_tokens}; raise it, shorten the prompt, or "
                     f"set data.overlong_prompts=skip")


def encode_prompts(samples: Sequence[TextSample], tokenizer: PreTrainedTokenizerBase, *,
                   max_tokens: int, chat_template: str = "auto",
                   overlong: str = "error") -> Prompts:
    """Every sample's prompt ids (`graft.data.prompts.PromptEncoder`); one over
    ``max_tokens`` is a `DataError` naming its file and line (``overlong="error"``) or is
    dropped (``"skip"``: counted, logged, and an error if none is left)."""
    encoder = PromptEncoder(tokenizer, chat_template)
    kept, ids, overlong_at = [], [], []
    for index, sample in enumerate(samples):
        prompt_ids = encoder.encode(sample.prompt, _label(sample, index))
        if len(prompt_ids) <= max_tokens:
            kept.append(sample)
            ids.append(prompt_ids)
        elif overlong == "skip":
            overlong_at.append((index, len(prompt_ids)))
        else:
            raise _too_long(sample, index, len(prompt_ids), max_tokens)
    _report_skipped(samples, overlong_at, max_tokens, left=len(kept))
    return Prompts(kept, ids, skipped=len(overlong_at))


def _report_skipped(samples: Sequence[TextSample], overlong_at: list[tuple[int, int]],
                    max_tokens: int, *, left: int) -> None:
    """Log the skipped prompts; none left is a `DataError`."""
    if not overlong_at:
        return
    index, tokens = overlong_at[0]
    where = f"the first: {_label(samples[index], index)}, {tokens} tokens"
    if left == 0:
        raise DataError(f"every one of the {len(samples)} prompts is longer than "
                        f"data.max_prompt_tokens={max_tokens} ({where}), so "
                        f"data.overlong_prompts=skip leaves none; raise data.max_prompt_tokens")
    logger.warning("skipped %d of %d prompts longer than data.max_prompt_tokens=%d "
                   "(data.overlong_prompts=skip; %s)", len(overlong_at), len(samples),
                   max_tokens, where)


def tokenize_sft(samples: Sequence[TextSample], tokenizer: PreTrainedTokenizerBase, *,
                 max_prompt_tokens: int, max_response_tokens: int, chat_template: str = "auto",
                 overlong_prompts: str = "error") -> list[TokenSample]:
    """Prompt and response ids; the loss covers the response. Prompts are encoded like RL's
    (`encode_prompts`: chat template, overlong prompts). A text response is its ids + ``eos``;
    a chat completion (messages) is rendered with the prompt through the chat template and
    only its assistant turns are trained (`graft.data.conversations.ConversationEncoder`).
    A response over ``max_response_tokens`` (a conversation: everything after the prompt) is a
    `DataError` naming the sample."""
    prompts = encode_prompts(samples, tokenizer, max_tokens=max_prompt_tokens,
                             chat_template=chat_template, overlong=overlong_prompts)
    position = {id(sample): index for index, sample in enumerate(samples)}
    conversations: ConversationEncoder | None = None
    out = []
    for sample, prompt in zip(prompts.samples, prompts.ids, strict=True):
        label = _label(sample, position[id(sample)])
        weights = None
        if isinstance(sample.response, str):
            response = tokenizer(sample.response, add_special_tokens=False)["input_ids"]
            response = [*response, tokenizer.eos_token_id]
        else:
            conversations = conversations or ConversationEncoder(PromptEncoder(tokenizer,
                                                                               chat_template))
            ids, mask = conversations.encode(list(sample.prompt), sample.response,
                                             context_ids=prompt, origin=label)
            response = ids[len(prompt):]
            weights = torch.tensor(mask[len(prompt):], dtype=torch.float32)
        if len(response) > max_response_tokens:
            raise DataError(f"{label}: the response has {len(response)} tokens, more than "
                            f"data.max_response_tokens={max_response_tokens}")
        out.append(TokenSample(prompt + response, len(prompt), weights))
    return out
