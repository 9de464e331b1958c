"""The graphed loop's grouped-query attention against transformers' SDPA attention."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from graft_graphed_decode import decode_attention
from graft_graphed_decode.decode_attention import grouped_query_decode_attention


def attention_module() -> torch.nn.Module:
    """A real grouped-query attention layer (8 query heads, 2 key/value heads)."""
    config = AutoConfig.for_model("llama", hidden_size=64, intermediate_size=128,
                                  num_hidden_layers=1, num_attention_heads=8,
                                  num_key_value_heads=2, vocab_size=32, attn_implementation="sdpa")
    return AutoModelForCausalLM.from_config(config).model.layers[0].self_attn


@pytest.mark.parametrize(("queries", "mask_limit"), [(1, 1), (5, 1 << 28), (5, 100)])
def test_grouped_attention_over_the_masked_slots_equals_sdpa_over_the_whole_cache(
        queries: int, mask_limit: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Decode steps, a prefill, and a prefill whose mask is too large to copy per query head
    (transformers' path, over the masked slots)."""
    monkeypatch.setattr(decode_attention, "GROUPED_MASK_ELEMENTS", mask_limit)
    module = attention_module()
    generator = torch.Generator().manual_seed(0)
    batch, cache_length, attended = 3, 16, 7
    query = torch.randn(batch, queries, 8, 8, generator=generator).transpose(1, 2)  # as Llama's
    key, value = (torch.randn(batch, 2, cache_length, 8, generator=generator) for _ in range(2))
    mask = torch.rand(batch, 1, queries, attended, generator=generator) > 0.3
    mask[..., 0] = True  # every row attends to something
    whole_cache = torch.zeros(batch, 1, queries, cache_length, dtype=torch.bool)
    whole_cache[..., :attended] = mask
    out, _ = grouped_query_decode_attention(module, query, key, value, mask, scaling=0.3)
    expected, _ = sdpa_attention_forward(module, query, key, value, whole_cache, scaling=0.3)
    assert out.shape == expected.shape == (batch, queries, 8, 8)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-6)
