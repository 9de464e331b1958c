"""`host_synchronising_experts`: which models' decode step a CUDA graph cannot capture, and the
decode loop running such a model without graphs (transformers' eager experts: the capture failed
on an H200 at their ``nonzero``)."""

from __future__ import annotations

import pytest
from transformers import AutoModelForCausalLM

from graft.models.builtin import tiny_deepseek_v3, tiny_qwen3_moe
from graft_graphed_decode.capturable import host_synchronising_experts
from graft_graphed_decode.decoder import GraphedDecoder


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

