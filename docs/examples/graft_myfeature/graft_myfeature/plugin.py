"""The entry point: Graft registers every @hookimpl function of this module.

Keep it cheap to import (no torch at top level): Graft imports it for every command. Each later
section of docs/plugins.md writes its hooks in a module of their own and adds one import of them
at the end of this file.
"""

from dataclasses import dataclass

from graft import hookimpl


@dataclass
class MyFeatureConfig:
    enabled: bool = False          # every field needs a default
    init_noise_std: float = 0.01
    is_cap: float = 2.0            # the capped-is loss's largest importance weight (section 5)


@hookimpl
def graft_config_sections():
    return [("myfeature", MyFeatureConfig)]      # -> features.myfeature in the config


@hookimpl
def graft_pre_shard(model, cfg, role):           # any subset of the spec's arguments
    section = cfg.features.myfeature
    if section.enabled and role == "policy":     # leave the frozen KL reference alone
        from graft_myfeature.noise import add_noise    # torch code imported lazily
        add_noise(model, section.init_noise_std, seed=cfg.trainer.seed)


# Section 3: a loss aggregation mode.
from graft_myfeature.losses import graft_loss_agg_modes, graft_loss_aggregate  # noqa: E402, F401


# Section 4: record in one pass, replay in the next.
from graft_myfeature.replay import (  # noqa: E402, F401
    graft_post_forward,
    graft_prepare_inputs,
    graft_step_begin,
    graft_step_end,
)


# Section 5: registry entries.
from graft_myfeature.registries import (  # noqa: E402, F401
    graft_advantage_estimators,
    graft_policy_losses,
    graft_reward_functions,
)


# Section 6: a multi-turn environment.
from graft_myfeature.environment import graft_environments  # noqa: E402, F401
