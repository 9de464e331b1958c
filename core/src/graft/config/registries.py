"""The registries a config value can name (``choice(..., registry=...)``), resolved with the
plugins of a run when the config is validated.

Everything here is looked up through the plugin hooks without importing torch, so
``graft config show|check`` stays fast.
"""

from __future__ import annotations

from collections.abc import Callable

from graft.plugins import GraftPluginManager
from graft.plugins.registry import collect_named

# registry name -> (hook returning {name: object}, what one entry is called in messages)
HOOK_REGISTRIES = {
    "policy_losses": ("graft_policy_losses", "policy loss"),
    "rewards": ("graft_reward_functions", "reward"),
    "advantage_estimators": ("graft_advantage_estimators", "advantage estimator"),
    "rollout_engines": ("graft_rollout_engines", "rollout engine"),
    "environments": ("graft_environments", "environment"),
    "trainer_modes": ("graft_trainer_modes", "trainer mode"),
}


def _model_presets(manager: GraftPluginManager) -> list[str]:
    from graft.models.registry import presets

    return sorted(presets(manager))


def _loss_agg_modes(manager: GraftPluginManager) -> list[str]:
    from graft.losses.registry import loss_agg_mode_names

    return loss_agg_mode_names(manager)


OTHER_REGISTRIES: dict[str, Callable[[GraftPluginManager], list[str]]] = {
    "model_presets": _model_presets,
    "loss_agg_modes": _loss_agg_modes,
}

REGISTRIES = (*HOOK_REGISTRIES, *OTHER_REGISTRIES)


def registry_names(registry: str, manager: GraftPluginManager) -> list[str]:
    """The names in ``registry`` for the plugins loaded in ``manager``."""
    if registry in OTHER_REGISTRIES:
        return OTHER_REGISTRIES[registry](manager)
    if registry not in HOOK_REGISTRIES:
        raise KeyError(f"unknown registry {registry!r}; known: {', '.join(REGISTRIES)}")
    hook_name, kind = HOOK_REGISTRIES[registry]
    return sorted(collect_named(manager, hook_name, kind))
