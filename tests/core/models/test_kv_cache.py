"""The KV-cache keyword on the installed transformers (``past_key_values`` up to 5.23, ``cache``
from 5.24): a cache passed with `cache_argument` is the one the model fills, and `passed_cache`
finds the cache ``generate`` passes, whatever the version."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from transformers import DynamicCache

from graft.config import ModelConfig
from graft.models import build_model, cache_argument, cache_keyword, passed_cache
from graft.models.kv_cache import CACHE_KEYWORDS


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    built, _ = build_model(ModelConfig(preset="tiny-llama"), seed=0)
    return built.eval()


def test_the_model_fills_the_cache_passed_by_its_keyword_without_a_warning(model) -> None:
    cache = DynamicCache(config=model.config)
    with warnings.catch_warnings():
        # the old name warns on 5.24 (FutureWarning) and is gone from 5.40; the new one is
        # swallowed by **kwargs before 5.24 and the cache stays empty
        warnings.simplefilter("error", FutureWarning)
        with torch.no_grad():
            model(input_ids=torch.tensor([[5, 6, 7, 8]]), use_cache=True,
                  **cache_argument(model, cache))
    assert cache.get_seq_length() == 4


def test_a_forward_pre_hook_finds_the_cache_generate_passes(model) -> None:
    seen: list[Any] = []

    def record(_: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        seen.append(passed_cache(kwargs))

    handle = model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=3, do_sample=False,
                       use_cache=True, pad_token_id=0)
    finally:
        handle.remove()
    assert len(seen) == 3 and all(cache is not None for cache in seen)


class OldStyle(torch.nn.Module):
    def forward(self, input_ids: torch.Tensor, past_key_values: Any = None) -> None: ...


class NewStyle(torch.nn.Module):
    def forward(self, input_ids: torch.Tensor, cache: Any = None) -> None: ...


class KeywordsOnly(torch.nn.Module):
    def forward(self, **kwargs: Any) -> None: ...


def test_the_keyword_is_read_from_each_models_own_forward(model) -> None:
    assert cache_keyword(OldStyle()) == "past_key_values"
    assert cache_keyword(NewStyle()) == "cache"
    # a forward that names neither gets what the installed transformers' generate passes
    assert cache_keyword(KeywordsOnly()) == cache_keyword(model) in CACHE_KEYWORDS


def test_passed_cache_accepts_either_name_and_prefers_the_current_one() -> None:
    old, new = object(), object()
    assert passed_cache({"past_key_values": old}) is old
    assert passed_cache({"cache": new, "past_key_values": old}) is new
    assert passed_cache({"cache": None, "past_key_values": old}) is old
    assert passed_cache({"input_ids": 1}) is None
