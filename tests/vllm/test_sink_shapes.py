"""The vLLM sink checks every staged name and shape against the engine's before it loads any:
an expert of a fused tensor is taken by its per-expert name. Needs no vLLM."""

from __future__ import annotations

import pytest
import torch

from graft.errors import GraftError
from graft.export import INFERENCE_LAYOUT
from graft_vllm.sink import VLLMSink, check_engine_shapes

pytestmark = pytest.mark.vllm


def test_vllm_sink_takes_the_experts_of_a_fused_tensor_by_name() -> None:
    expected = {"m.experts.w": (8, 3, 2), "m.norm": (3,)}
    check_engine_shapes({"m.experts.0.w": torch.zeros(3, 2), "m.norm": torch.zeros(3)}, expected)
    with pytest.raises(GraftError, match=r"m.experts.8.w \(3, 2\) does not match"):
        check_engine_shapes({"m.experts.8.w": torch.zeros(3, 2)}, expected)
    with pytest.raises(GraftError, match=r"m.norm \(4,\) does not match"):
        check_engine_shapes({"m.norm": torch.zeros(4)}, expected)


def test_the_sink_asks_for_an_inference_engines_layout() -> None:
    assert VLLMSink.consumer == INFERENCE_LAYOUT == "inference"
