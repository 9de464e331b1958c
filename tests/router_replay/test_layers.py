"""Router maps from each family's adapters: positions, decoder layers, static routers, sizes."""

from __future__ import annotations

import dataclasses

import pytest

from graft.config import ModelConfig
from graft.errors import ConfigError
from graft.models import build_model
from graft_router_replay.layers import router_map

# preset -> (decoder layer of each MoE layer, static flags, experts, top-k)
EXPECTED = {
    "tiny-qwen3-moe": ([0, 1], [False, False], 8, 2),
    "tiny-deepseek-v3": ([1], [False], 8, 2),  # the first layer is dense
    "tiny-gpt-oss": ([0, 1], [False, False], 8, 2),
    "tiny-deepseek-v4": ([0, 1], [True, False], 8, 2),  # layer 0 routes by token id
}


@pytest.mark.parametrize("preset", EXPECTED)
def test_every_family_maps_its_routers_in_layer_order(preset: str) -> None:
    model, family = build_model(ModelConfig(preset=preset))
    routers = router_map(model, family)
    decoder_layers, static, experts, top_k = EXPECTED[preset]
    assert routers.decoder_layers == decoder_layers
    assert [s.static for s in routers.slots] == static
    assert [s.position for s in routers.slots] == list(range(len(decoder_layers)))
    assert (routers.num_experts, routers.top_k, routers.num_hidden_layers) == (experts, top_k, 2)
    assert routers.learned_positions == {i for i, s in enumerate(static) if not s}


def test_more_experts_than_int16_holds_is_a_config_error() -> None:
    model, family = build_model(ModelConfig(preset="tiny-qwen3-moe"))
    for router in family.router_modules(model):
        router.num_experts = 40000
    with pytest.raises(ConfigError, match="40000 experts.*at most 32767"):
        router_map(model, family)


def test_a_dense_model_or_a_family_without_routing_weights_is_refused() -> None:
    model, family = build_model(ModelConfig(preset="tiny-llama"))
    with pytest.raises(ConfigError, match="needs a MoE model"):
        router_map(model, family)
    model, family = build_model(ModelConfig(preset="tiny-qwen3-moe"))
    with pytest.raises(ConfigError, match="no routing_weights"):
        router_map(model, dataclasses.replace(family, routing_weights=None))
