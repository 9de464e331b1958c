"""Record -> replay on every MoE family, through the plugin's forward hooks (the session's
phase table), with real models: exact reproduction, forced experts, the row rule, top-1 models,
recompute, and the step's metrics."""

from __future__ import annotations

import pytest
import torch

import graft_router_replay.plugin as plugin
from graft.engine import apply_activation_checkpointing
from graft_router_replay.routes import ROUTES, VALID, real_tokens

# preset -> (MoE layers, positions of the routers replay forces)
FAMILIES = {"tiny-qwen3-moe": (2, {0, 1}), "tiny-deepseek-v3": (1, {0}),
            "tiny-gpt-oss": (2, {0, 1}), "tiny-deepseek-v4": (2, {1})}


def move_routers(routers, seed: int = 5) -> None:
    """Change every router's weights a lot, so native routing no longer matches the record."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for router in routers:
            router.weight.add_(torch.randn(router.weight.shape, generator=generator) * 0.5)


def record_then_move_routers(run, batch) -> list[torch.nn.Module]:
    """Record ``batch``'s routes (an old-log-prob pass), then move the routers: native routing
    no longer matches the record. Returns the routers."""
    routers = run.family.router_modules(run.model)
    with torch.no_grad():
        run.forward(batch, "old_logprobs")
    move_routers(routers)
    return routers


@pytest.mark.parametrize("preset", FAMILIES)
def test_r2_replay_with_unchanged_weights_is_bit_identical(replayable, observe, preset: str) -> None:
    run = replayable(preset)
    batch = run.batch(pad_bucket=32)
    observer = observe(run.family.router_modules(run.model))
    with torch.no_grad():
        native, kept = run.forward(batch, "old_logprobs")
    layers = FAMILIES[preset][0]
    routes = kept[ROUTES]
    assert routes.dtype == torch.int16
    assert routes.shape == (batch.layout.num_rows, batch.layout.row_length, layers, 2)
    assert torch.equal(routes.reshape(-1, layers, 2).long(), observer.stacked())
    assert torch.equal(kept[VALID], real_tokens(batch.layout))
    replayed, _ = run.forward(batch, "update")
    assert torch.equal(replayed, native)


@pytest.mark.parametrize("preset", FAMILIES)
def test_replay_forces_the_recorded_experts_after_the_routers_moved(replayable, observe,
                                                                   preset: str) -> None:
    run = replayable(preset)
    routers = run.family.router_modules(run.model)
    batch = run.batch(pad_bucket=32)
    with torch.no_grad():
        run.forward(batch, "old_logprobs")
    recorded = batch.tensors[ROUTES].reshape(-1, FAMILIES[preset][0], 2).long()
    move_routers(routers)
    observer = observe(routers)
    with torch.no_grad():
        native_logits, _ = run.forward(batch, "ref_logprobs")  # a pass that never replays
    native = observer.stacked()
    own_choice = observe(routers, raw=True)  # what each router picks given replayed inputs
    logits, _ = run.forward(batch, "update")
    used = observer.stacked()
    real = real_tokens(batch.layout).reshape(-1)
    learned = sorted(FAMILIES[preset][1])
    assert not torch.equal(native[real][:, learned], recorded[real][:, learned])
    assert torch.equal(used[real][:, learned], recorded[real][:, learned])
    assert torch.equal(used[~real], native[~real])  # pad rows route natively
    static = [p for p in range(recorded.shape[1]) if p not in learned]
    assert torch.equal(used[:, static], native[:, static])  # hash routers are left alone
    assert not torch.equal(logits, native_logits)
    logits.sum().backward()  # the weights of the replayed experts come from the router
    assert all(routers[p].weight.grad.abs().sum() > 0 for p in learned)

    metrics = {}
    plugin.graft_step_end(metrics=metrics)
    own = own_choice.stacked()
    found = (recorded[real][:, learned, :, None] == own[real][:, learned, None, :]).any(-1)
    assert metrics["router_replay/mismatch_fraction"] == pytest.approx(
        float((~found).float().mean()))
    assert metrics["router_replay/fallback_rows"] == 0.0
    assert metrics["router_replay/bytes_per_token"] == FAMILIES[preset][0] * 2 * 2 + 1


def test_rows_with_a_repeated_expert_route_natively(replayable, observe) -> None:
    run = replayable("tiny-qwen3-moe")
    batch = run.batch()
    routers = record_then_move_routers(run, batch)
    flat = batch.tensors[ROUTES].view(-1, 2, 2)
    duplicated = torch.tensor([3, 17, 30])
    flat[duplicated, 0] = 5  # layer 0 of these tokens names expert 5 twice
    recorded = flat.long().clone()
    observer = observe(routers)
    with torch.no_grad():
        run.forward(batch, "ref_logprobs")
        native = observer.stacked()
        run.forward(batch, "update")
    used = observer.stacked()
    assert torch.equal(used[duplicated, 0], native[duplicated, 0])
    assert torch.equal(used[duplicated, 1], recorded[duplicated, 1])  # the other layer replays
    others = torch.ones(len(flat), dtype=torch.bool)
    others[duplicated] = False
    assert torch.equal(used[others], recorded[others])
    metrics = {}
    plugin.graft_step_end(metrics=metrics)
    assert metrics["router_replay/fallback_rows"] == pytest.approx(3 / (2 * len(flat)))


def test_a_top_1_model_replays_and_rows_without_a_route_route_natively(replayable, observe) -> None:
    run = replayable("tiny-qwen3-moe", "R3", "+model.overrides.num_experts_per_tok=1")
    routers = run.family.router_modules(run.model)
    batch = run.batch()
    observer = observe(routers)
    with torch.no_grad():
        run.model(input_ids=batch.tensors["input_ids"], position_ids=batch.tensors["position_ids"])
    native = observer.stacked()  # (tokens, 2, 1)
    # R3 routes as a rollout engine leaves them: every row names expert 0, and only the even
    # tokens have a route. With one expert per token a zero row repeats nothing: only the
    # valid flag keeps the odd tokens on their own routing.
    rows, length = batch.layout.num_rows, batch.layout.row_length
    batch.tensors[ROUTES] = torch.zeros(rows, length, 2, 1, dtype=torch.int16)
    valid = torch.zeros(rows * length, dtype=torch.bool)
    valid[::2] = True
    batch.tensors[VALID] = valid.view(rows, length)
    with torch.no_grad():
        run.forward(batch, "update")
    used = observer.stacked()
    assert (native[1::2] != 0).any(), "some tokens natively prefer another expert"
    assert torch.equal(used[::2], torch.zeros_like(used[::2]))
    assert torch.equal(used[1::2], native[1::2])


def test_checkpoint_recompute_replays_the_same_layers(replayable, observe) -> None:
    run = replayable("tiny-qwen3-moe")
    batch = run.batch()
    routers = record_then_move_routers(run, batch)

    def gradients() -> dict[str, torch.Tensor]:
        run.model.zero_grad()
        logits, _ = run.forward(batch, "update")
        logits.square().mean().backward()
        return {n: p.grad.clone() for n, p in run.model.named_parameters() if p.grad is not None}

    run.model.train()
    plain = gradients()
    fires = []
    handles = [r.register_forward_hook(lambda *_: fires.append(1)) for r in routers]
    apply_activation_checkpointing(run.model)  # the engine's engine.activation_checkpointing
    recomputed = gradients()
    assert len(fires) == 2 * len(routers), "backward recomputed every router"
    for handle in handles:
        handle.remove()
    assert plain.keys() == recomputed.keys()
    for name, grad in plain.items():
        assert torch.equal(grad, recomputed[name]), name


def test_pad_to_length_does_not_change_replayed_log_probs(replayable, observe) -> None:
    run = replayable("tiny-qwen3-moe")
    routers = run.family.router_modules(run.model)
    plain, padded = run.batch(), run.batch(pad_bucket=64)
    with torch.no_grad():
        run.forward(plain, "old_logprobs")
        run.forward(padded, "old_logprobs")
        move_routers(routers)
        results = [run.forward(b, "update")[0] for b in (plain, padded)]
    for a, b in zip(plain.layout.unpad(results[0]), padded.layout.unpad(results[1]), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
