"""The plugin's own tests (`pytest tests`); graft's pytest plugin provides `graft_plugin`."""

import torch

import graft
import graft_myfeature.plugin as plugin
from graft.losses.aggregation import AggregationContext
from graft.losses.registry import aggregate_loss
from graft.testing import check_config_section, check_installed_plugin, check_plugin


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
    manager.hook.graft_pre_shard(model=model, cfg=cfg, mesh=None)
    assert not any(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_mode_sums_the_mean_loss_of_each_sequence(graft_plugin):
    manager = graft_plugin(plugin, name="myfeature")
    loss = torch.tensor([[1.0, 3.0, 9.0], [4.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    ctx = AggregationContext(global_tokens=3, global_sequences=2, dp_size=1,
                             loss_scale_factor=3.0)
    assert aggregate_loss(loss, mask, "seq-sum-token-mean", ctx, manager).item() == 2.0 + 4.0
