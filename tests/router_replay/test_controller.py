"""Replay is strict: routes that do not fit the model, or a forward that misses a recorded
layer, raise `RouteError` naming what is wrong."""

from __future__ import annotations

import pytest
import torch

import graft_router_replay.plugin as plugin
from graft_router_replay.routes import ROUTES, VALID, RouteError


def recorded_batch(run, **kwargs):
    batch = run.batch(**kwargs)
    with torch.no_grad():
        run.forward(batch, "old_logprobs")
    return batch


def test_routes_with_another_layer_count_are_refused(replayable) -> None:
    run = replayable("tiny-qwen3-moe")
    batch = recorded_batch(run)
    batch.tensors[ROUTES] = torch.cat([batch.tensors[ROUTES]] * 2, dim=2)  # 4 layers, model has 2
    with pytest.raises(RouteError, match=r"expected \(tokens, 2 MoE layers, top-2\)"):
        run.forward(batch, "update")


def test_routes_that_do_not_cover_the_token_grid_are_refused(replayable) -> None:
    run = replayable("tiny-qwen3-moe")
    batch = recorded_batch(run)
    batch.tensors[ROUTES] = batch.tensors[ROUTES][:, :-3]
    with pytest.raises(RouteError, match="do not cover the micro-batch"):
        run.forward(batch, "update")


def test_r3_without_routes_in_the_micro_batch_is_an_error(replayable) -> None:
    run = replayable("tiny-qwen3-moe", "R3")
    with pytest.raises(RouteError, match="mode=R3 replays routes in the old_logprobs pass"):
        run.forward(run.batch(), "old_logprobs")


def test_a_router_fed_other_tokens_than_its_targets_raises(replayable) -> None:
    run = replayable("tiny-qwen3-moe")
    batch = recorded_batch(run)
    other = run.batch(pad_bucket=64)  # another token count than the armed targets
    plugin.graft_prepare_inputs(batch=batch.tensors, layout=batch.layout, phase="update", shard=None)
    with pytest.raises(RouteError, match="routes 64 tokens but its replay targets hold"):
        run.model(input_ids=other.tensors["input_ids"], position_ids=other.tensors["position_ids"])


def test_a_replayed_forward_that_skips_a_recorded_layer_raises(replayable) -> None:
    run = replayable("tiny-qwen3-moe")
    batch = recorded_batch(run)
    plugin.graft_prepare_inputs(batch=batch.tensors, layout=batch.layout, phase="update", shard=None)
    run.model.model.layers[0](  # only the first decoder block runs
        run.model.model.embed_tokens(batch.tensors["input_ids"]),
        position_embeddings=run.model.model.rotary_emb(
            run.model.model.embed_tokens(batch.tensors["input_ids"]),
            batch.tensors["position_ids"]))
    with pytest.raises(RouteError, match=r"positions \[1\] did not route during a replayed"):
        plugin.graft_post_forward(layout=batch.layout, shard=None)


def test_a_recorded_forward_that_skips_a_layer_raises(replayable) -> None:
    run = replayable("tiny-qwen3-moe")
    batch = run.batch()
    plugin.graft_prepare_inputs(batch=batch.tensors, layout=batch.layout, phase="old_logprobs", shard=None)
    with pytest.raises(RouteError, match=r"positions \[0, 1\] did not route during the recorded"):
        plugin.graft_post_forward(layout=batch.layout, shard=None)


def test_the_reference_pass_never_replays(replayable, observe) -> None:
    run = replayable("tiny-qwen3-moe", "R3")
    batch = run.batch()
    routers = run.family.router_modules(run.model)
    rows, length = batch.layout.num_rows, batch.layout.row_length
    batch.tensors[ROUTES] = torch.tensor([6, 7], dtype=torch.int16).expand(rows, length, 2, 2)
    batch.tensors[VALID] = torch.ones(rows, length, dtype=torch.bool)
    observer = observe(routers)
    with torch.no_grad():
        run.forward(batch, "ref_logprobs")
        native = observer.stacked()
        run.forward(batch, "old_logprobs")
    assert not (native == torch.tensor([6, 7])).all()
    assert (observer.stacked() == torch.tensor([6, 7])).all()
