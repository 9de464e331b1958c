"""The core's own loss hooks, registered as a built-in plugin.

Kept free of torch imports at module level: the plugin manager loads it for every command,
including ``graft plugins`` and ``graft config``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from graft.hookspecs import hookimpl
from graft.losses.contract import BUILTIN_AGG_MODES

if TYPE_CHECKING:
    import torch

    from graft.losses.contract import AggregationContext


@hookimpl(trylast=True)
def graft_loss_aggregate(loss_mat: torch.Tensor, loss_mask: torch.Tensor, mode: str,
                         ctx: AggregationContext) -> torch.Tensor | None:
    """The built-in modes; plugins are asked first, so they may also redefine one."""
    if mode not in BUILTIN_AGG_MODES:
        return None
    from graft.losses.aggregation import aggregate_builtin

    return aggregate_builtin(loss_mat, loss_mask, mode, ctx)


@hookimpl
def graft_loss_agg_modes() -> list[str]:
    """The built-in modes."""
    return list(BUILTIN_AGG_MODES)


@hookimpl
def graft_config_choices() -> dict[str, Any]:
    """``policy_losses`` and ``loss_agg_modes`` (whose error names the plugins that aggregate
    without declaring their modes)."""
    from graft.losses.registry import agg_mode_hint, loss_agg_mode_names, policy_loss_names

    return {"policy_losses": lambda *, manager: policy_loss_names(manager),
            "loss_agg_modes": (lambda *, manager: loss_agg_mode_names(manager),
                               lambda *, manager: agg_mode_hint(manager))}


@hookimpl
def graft_policy_losses() -> dict[str, Any]:
    """The core's policy loss: ``ppo`` (clip, dual clip); plugins add more (graft-gspo's
    ``gspo``)."""
    from graft.losses.policy import ppo_clip_loss

    return {"ppo": ppo_clip_loss}
