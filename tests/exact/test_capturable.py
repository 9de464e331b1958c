"""The exact kernels keep graft-graphed-decode's CUDA graphs: MoE models get the exact experts
(`graft_exact.experts`, no host synchronisation), which a graph captures, and the exact
attention takes the loop's boolean masks (`graft.rollout.register_boolean_mask_attention`)."""

from __future__ import annotations

import pytest
from graft_exact import install_exact_kernels
from graft_exact.attention import EXACT_ATTENTION
from graft_exact.experts import EXACT_EXPERTS
from transformers import AutoModelForCausalLM

from graft.models.builtin import tiny_deepseek_v3, tiny_llama, tiny_qwen3_moe
from graft_graphed_decode.capturable import host_synchronising_experts
from graft_graphed_decode.decoder import GraphedDecoder, decodes_with_graphs


def decoder(model) -> GraphedDecoder:
    return GraphedDecoder(model, pad_token_id=0, eos_token_id=None, use_graphs=True)


@pytest.mark.parametrize("preset", [tiny_qwen3_moe, tiny_deepseek_v3])
def test_the_exact_experts_keep_the_graphs(preset) -> None:
    model = AutoModelForCausalLM.from_config(preset())
    install_exact_kernels(model)
    assert model.config._experts_implementation == EXACT_EXPERTS
    assert host_synchronising_experts(model) == []
    assert decoder(model).use_graphs


def test_a_dense_model_keeps_its_graphs_and_its_exact_attention() -> None:
    model = AutoModelForCausalLM.from_config(tiny_llama())
    install_exact_kernels(model)
    assert host_synchronising_experts(model) == []
    assert decodes_with_graphs(model)
    made = decoder(model)
    assert made.use_graphs and made.boolean_mask
    assert model.config._attn_implementation == EXACT_ATTENTION  # not the grouped-query one
