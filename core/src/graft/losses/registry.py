"""Registries of policy losses and aggregation modes, gathered from the core and plugins."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from graft.errors import ConfigError
from graft.plugins import GraftPluginManager, get_plugin_manager
from graft.plugins.registry import collect_named

if TYPE_CHECKING:
    import torch

    from graft.losses.aggregation import AggregationContext


def policy_losses(manager: GraftPluginManager | None = None) -> dict[str, Callable[..., Any]]:
    """Every policy loss by name; two providers of one name is a `PluginError` naming both."""
    manager = manager or get_plugin_manager()
    return collect_named(manager.hook.graft_policy_losses, "policy loss")


def policy_loss_names(manager: GraftPluginManager | None = None) -> list[str]:
    """Names valid for ``loss.policy_loss``."""
    return sorted(policy_losses(manager))


def loss_agg_mode_names(manager: GraftPluginManager | None = None) -> list[str]:
    """Names valid for ``loss.loss_agg_mode``: built-ins first, then plugins' modes."""
    manager = manager or get_plugin_manager()
    names: list[str] = []
    for modes in reversed(manager.hook.graft_loss_agg_modes()):
        names.extend(m for m in modes if m not in names)
    return names


def aggregate_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor, mode: str,
                   ctx: AggregationContext,
                   manager: GraftPluginManager | None = None) -> torch.Tensor:
    """Reduce a micro-batch's loss matrix through ``graft_loss_aggregate`` (plugins first)."""
    manager = manager or get_plugin_manager()
    result = manager.hook.graft_loss_aggregate(loss_mat=loss_mat, loss_mask=loss_mask, mode=mode,
                                               ctx=ctx)
    if result is None:
        raise ConfigError(f"loss.loss_agg_mode={mode!r} is handled by no plugin; valid modes: "
                          f"{', '.join(loss_agg_mode_names(manager))}")
    return result
