"""`host_synchronising_experts`: which models' decode step a CUDA graph cannot capture, and the
decode loop running such a model without graphs (transformers' eager experts: the capture failed
on an H200 at their ``nonzero``). ``rollout.exact`` gives MoE models the exact experts
(`graft.engine.exact.experts`), which a graph captures."""

from __future__ import annotations

import pytest
from transformers import AutoModelForCausalLM

from graft.engine.exact import install_exact_kernels
from graft.engine.exact.experts import EXACT_EXPERTS
from graft.models.builtin import tiny_deepseek_v3, tiny_llama, tiny_qwen3_moe
from graft.rollout.capturable import host_synchronising_experts
from graft.rollout.graphed_decode import GraphedDecoder


def decoder(model, **kwargs) -> GraphedDecoder:
    return GraphedDecoder(model, pad_token_id=0, eos_token_id=None, use_graphs=True, **kwargs)


@pytest.mark.parametrize("preset", [tiny_qwen3_moe, tiny_deepseek_v3])
def test_eager_experts_are_found_and_decode_without_graphs(preset) -> None:
    model = AutoModelForCausalLM.from_config(preset())
    assert host_synchronising_experts(model) == []  # grouped GEMMs: capturable
    assert decoder(model).use_graphs
    model.set_experts_implementation("eager")
    found = host_synchronising_experts(model)
    assert found and all(name.endswith("mlp.experts") for name in found)
    assert not decoder(model).use_graphs


@pytest.mark.parametrize("preset", [tiny_qwen3_moe, tiny_deepseek_v3])
def test_the_exact_experts_keep_the_graphs(preset) -> None:
    model = AutoModelForCausalLM.from_config(preset())
    install_exact_kernels(model)
    assert model.config._experts_implementation == EXACT_EXPERTS
    assert host_synchronising_experts(model) == []
    assert decoder(model, exact=True).use_graphs


def test_a_dense_model_keeps_its_graphs() -> None:
    model = AutoModelForCausalLM.from_config(tiny_llama())
    install_exact_kernels(model)
    assert host_synchronising_experts(model) == []
    assert decoder(model, exact=True).use_graphs
