"""A plugin that implements ``graft_loss_aggregate`` but declares no mode with
``graft_loss_agg_modes`` is flagged by ``graft plugins`` and named in the unknown-mode errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graft import hookimpl
from graft.errors import ConfigError
from graft.losses.registry import agg_mode_hint, aggregate_loss, undeclared_aggregators
from graft.plugins import GraftPluginManager

PLUGIN_SOURCE = '''
from graft import hookimpl


@hookimpl
def graft_loss_aggregate(loss_mat, loss_mask, mode):
    return (loss_mat * loss_mask).max() if mode == "max" else None
'''


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An installed distribution ``graft-maxagg`` exposing the plugin ``maxagg``."""
    root = tmp_path_factory.mktemp("undeclared-site")
    (root / "graft_maxagg.py").write_text(PLUGIN_SOURCE)
    info = root / "graft_maxagg-0.2.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: graft-maxagg\nVersion: 0.2.0\n")
    (info / "entry_points.txt").write_text("[graft.plugins]\nmaxagg = graft_maxagg\n")
    return root


class MaxAggregator:
    @hookimpl
    def graft_loss_aggregate(self, loss_mat, loss_mask, mode):
        return (loss_mat * loss_mask).max() if mode == "max" else None


class DeclaredMaxAggregator(MaxAggregator):
    @hookimpl
    def graft_loss_agg_modes(self):
        return ["max"]


def manager_with(**plugins: object) -> GraftPluginManager:
    manager = GraftPluginManager()
    manager.load(candidates=[])
    for name, plugin in plugins.items():
        manager.register(plugin, name)
    return manager


def test_graft_plugins_flags_the_plugin(run_graft, site: Path) -> None:
    result = run_graft(["plugins", "--json"], site=site)
    assert result.returncode == 0, result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    (warning,) = rows["maxagg"]["warnings"]
    assert "declares no mode" in warning and "graft_loss_agg_modes" in warning
    table = run_graft(["plugins"], site=site, env={"COLUMNS": "1000"})
    assert "warning: implements graft_loss_aggregate but declares no mode" in table.stdout


def test_only_aggregators_without_declared_modes_are_named() -> None:
    manager = manager_with(undeclared=MaxAggregator(), declared=DeclaredMaxAggregator())
    assert undeclared_aggregators(manager) == ["undeclared"]
    hint = agg_mode_hint(manager)
    assert hint.startswith(" ") and "'undeclared'" in hint and "'declared'" not in hint
    assert "implement graft_loss_agg_modes" in hint
    assert agg_mode_hint(manager_with(declared=DeclaredMaxAggregator())) == ""


def test_unhandled_mode_error_names_the_undeclared_aggregator() -> None:
    import torch

    from graft.losses.aggregation import AggregationContext

    manager = manager_with(undeclared=MaxAggregator())
    ctx = AggregationContext(global_tokens=2.0, global_sequences=1.0, dp_size=1,
                             loss_scale_factor=2.0)
    ones = torch.ones(1, 2)
    assert aggregate_loss(ones * 3, ones, "max", ctx, manager).item() == 3.0
    with pytest.raises(ConfigError, match=r"'min' is handled by no plugin; valid modes: "
                                          r"token-mean.* 'undeclared'.*graft_loss_agg_modes"):
        aggregate_loss(ones, ones, "min", ctx, manager)


def test_config_error_for_the_mode_names_the_plugin(run_graft, site: Path) -> None:
    result = run_graft(["config", "show", "loss.loss_agg_mode=max"], site=site)
    assert result.returncode == 2
    assert "'maxagg'" in result.stderr and "graft_loss_agg_modes" in result.stderr
