"""Registries of policy losses and aggregation modes, gathered from the core and plugins."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from graft.errors import ConfigError
from graft.losses.contract import BUILTIN_AGG_MODES, AggregationContext
from graft.plugins import GraftPluginManager, get_plugin_manager
from graft.plugins.registry import collect_named, implementers_without

if TYPE_CHECKING:
    import torch


def policy_losses(manager: GraftPluginManager | None = None) -> dict[str, Callable[..., Any]]:
    """Every policy loss by name; two providers of one name is a `PluginError` naming both."""
    manager = manager or get_plugin_manager()
    return collect_named(manager, "graft_policy_losses", "policy loss")


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
    """Reduce a micro-batch's per-token loss to the scalar that is back-propagated, as the
    trainer does: through ``graft_loss_aggregate`` (plugins first, then the core's modes).

    ``loss_mat`` and ``loss_mask`` are ``(num_sequences, max_len)``; ``mode`` is a
    ``loss.loss_agg_mode``; ``ctx`` the mini-batch's normalisers. A mode no plugin handles is a
    `ConfigError` listing the valid modes. ``manager``: the process's plugins by default."""
    manager = manager or get_plugin_manager()
    result = manager.hook.graft_loss_aggregate(loss_mat=loss_mat, loss_mask=loss_mask, mode=mode,
                                               ctx=ctx)
    if result is None:
        raise ConfigError(f"loss.loss_agg_mode={mode!r} is handled by no plugin; valid modes: "
                          f"{', '.join(loss_agg_mode_names(manager))}.{agg_mode_hint(manager)}")
    return result


def undeclared_aggregators(manager: GraftPluginManager | None = None) -> list[str]:
    """Names of the plugins that implement ``graft_loss_aggregate`` but not ``graft_loss_agg_modes``.

    Their modes would work in the loss, but config validation rejects them: only declared names
    are valid values of ``loss.loss_agg_mode``.
    """
    return implementers_without(manager or get_plugin_manager(), "graft_loss_aggregate",
                                "graft_loss_agg_modes")


def agg_mode_hint(manager: GraftPluginManager | None = None) -> str:
    """The sentence to append to an unknown ``loss.loss_agg_mode`` error; "" when none applies.

    It names the plugins that aggregate without declaring their modes and says how to fix them.
    It starts with a space, so it follows the error's last sentence directly.
    """
    names = undeclared_aggregators(manager)
    if not names:
        return ""
    return (f" Plugins implementing graft_loss_aggregate without declaring a mode: "
            f"{', '.join(map(repr, names))}; such a plugin must also implement "
            f"graft_loss_agg_modes, returning the mode names it handles, for config validation "
            f"to accept them.")


def builtin_aggregation(mode: str, manager: GraftPluginManager | None = None) -> bool:
    """True when ``mode`` is a built-in ``loss_agg_mode`` that the core itself aggregates (its
    formulas are linear in the per-token loss): no plugin's ``graft_loss_aggregate`` takes it.

    Plugins are asked first and may redefine a built-in mode, so each one is asked here, on a
    one-token loss, as the loss would ask it.
    """
    import torch

    if mode not in BUILTIN_AGG_MODES:
        return False
    manager = manager or get_plugin_manager()
    probe = dict(loss_mat=torch.zeros(1, 1), loss_mask=torch.ones(1, 1), mode=mode,
                 ctx=AggregationContext(1.0, 1.0, 1, 1.0))
    for impl in manager.hook.graft_loss_aggregate.get_hookimpls():
        if impl.plugin_name == "graft.losses.builtin":
            continue
        try:
            taken = impl.function(**{name: probe[name] for name in impl.argnames})
        except Exception:  # noqa: BLE001 - a plugin that fails on the probe may take the mode
            return False
        if taken is not None:
            return False
    return True
