"""`host_synchronising_experts`: which models' decode step a CUDA graph cannot capture, and the
decode loop running such a model without graphs (``rollout.exact`` on an MoE model: the
capture failed on an H200 at the eager experts' ``nonzero``)."""

from __future__ import annotations

import pytest
from transformers import AutoModelForCausalLM

from graft.engine.exact import install_exact_kernels
from graft.models.builtin import tiny_deepseek_v3, tiny_llama, tiny_qwen3_moe
from graft.rollout.capturable import host_synchronising_experts
from graft.rollout.graphed_decode import GraphedDecoder


@pytest.mark.parametrize("preset", [tiny_qwen3_moe, tiny_deepseek_v3])
def test_eager_experts_are_found_and_decode_without_graphs(preset) -> None:
    model = AutoModelForCausalLM.from_config(preset())
    assert host_synchronising_experts(model) == []  # grouped GEMMs: capturable
    assert GraphedDecoder(model, pad_token_id=0, eos_token_id=None, use_graphs=True).use_graphs
    install_exact_kernels(model)
    found = host_synchronising_experts(model)
    assert found and all(name.endswith("mlp.experts") for name in found)
    decoder = GraphedDecoder(model, pad_token_id=0, eos_token_id=None, use_graphs=True,
                             exact=True)
    assert not decoder.use_graphs


def test_a_dense_model_keeps_its_graphs() -> None:
    model = AutoModelForCausalLM.from_config(tiny_llama())
    install_exact_kernels(model)
    assert host_synchronising_experts(model) == []
    assert GraphedDecoder(model, pad_token_id=0, eos_token_id=None, use_graphs=True,
                          exact=True).use_graphs
