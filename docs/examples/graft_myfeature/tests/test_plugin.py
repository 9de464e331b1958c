"""The plugin's own tests (`pytest tests`); graft's pytest plugin provides `graft_plugin`."""

import torch

import graft
import graft_myfeature.plugin as plugin
from graft.testing import (
    AggregationContext,
    aggregate_loss,
    check_config_section,
    check_installed_plugin,
    check_plugin,
)


def test_plugin_matches_the_specs():
    check_plugin(plugin)                      # names, arguments, config section composes


def test_entry_point_loads():
    check_installed_plugin("myfeature")


def test_section_defaults():
    assert check_config_section("myfeature", plugin.MyFeatureConfig)["enabled"] is False


def test_noise_is_added_when_enabled(graft_plugin):   # pytest fixture shipped with graft
    manager = graft_plugin(plugin, name="myfeature")    # this copy, for this test only
    cfg = graft.compose(["model.preset=tiny-llama", "features.myfeature.enabled=true"],
                        manager=manager)
    model, _ = graft.build_model(cfg.model)
    before = [p.clone() for p in model.parameters()]
    manager.hook.graft_pre_shard(model=model, cfg=cfg, mesh=None, role="policy", meshes=None)
    assert not any(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_mode_sums_the_mean_loss_of_each_sequence(graft_plugin):
    manager = graft_plugin(plugin, name="myfeature")
    loss = torch.tensor([[1.0, 3.0, 9.0], [4.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    ctx = AggregationContext(global_tokens=3, global_sequences=2, dp_size=1,
                             loss_scale_factor=3.0)
    assert aggregate_loss(loss, mask, "seq-sum-token-mean", ctx, manager).item() == 2.0 + 4.0


def test_pairwise_advantages_ignore_scale_and_ties(graft_plugin):
    from graft.testing import advantage_estimators, compute_advantages

    manager = graft_plugin(plugin, name="myfeature")
    cfg = graft.compose(["algorithm.advantage=pairwise", "rollout.n=3"], manager=manager)
    estimator = advantage_estimators(manager)["pairwise"]
    rewards = torch.tensor([1.0, 5.0, 3.0, 0.7, 0.7, 0.7])
    advantages = compute_advantages(estimator, rewards, group_size=3, cfg=cfg)
    assert advantages.tolist() == [-1.0, 1.0, 0.0, 0.0, 0.0, 0.0]


def test_prefix_reward_gives_partial_credit():
    from types import SimpleNamespace

    from graft_myfeature.registries import prefix_reward

    sample = SimpleNamespace(answer="abab")
    assert prefix_reward(response="abzz", sample=sample) == 0.5
    assert prefix_reward(response="abababab", sample=sample) == 1.0


def test_a_hint_costs_and_an_answer_ends_the_episode():
    from types import SimpleNamespace

    import pytest

    from graft_multiturn import MalformedAction
    from graft_myfeature.environment import HintEnvironment

    env = HintEnvironment()
    assert env.reset(SimpleNamespace(answer="abab")) is None
    assert env.step([], "which?") == (" hint: ab\n", -0.1, False)
    assert env.step([], "abab") == (None, None, True)
    with pytest.raises(MalformedAction):
        env.step([], "?")


def test_an_rl_step_replays_what_the_old_logprob_pass_kept(graft_plugin, tmp_path):
    graft_plugin(plugin, name="myfeature")
    metrics = graft.train(overrides=[
        f"trainer.run_dir={tmp_path}", "trainer.total_steps=1", "engine.device=cpu",
        "rollout.prompts_per_step=2", "rollout.n=2", "algorithm.mini_batches=2",
        "engine.max_tokens_per_micro_batch=32",
        "algorithm.advantage=pairwise", "loss.policy_loss=capped-is", "algorithm.reward=prefix",
        "features.myfeature.enabled=true", "checkpoint.save_at_end=false",
        "export.hf_at_end=false"])
    assert metrics[0]["myfeature/replayed_tokens"] > 0
    assert 0 < metrics[0]["is_weight"] <= 2.0
