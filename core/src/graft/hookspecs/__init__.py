"""Hook specifications: the public contract between Graft's core and its plugins.

A plugin is a module (or object) with functions decorated by `graft.hookimpl`, named after the
specs below and exposed through an entry point in the group ``graft.plugins``. Rules that hold
for every hook:

* The core calls hooks with keyword arguments only. An implementation may accept any subset of a
  spec's arguments (new arguments can be added without breaking plugins), in any order.
* Unless a spec says ``firstresult``, every implementation runs and the results come back as a
  list (most recently registered first; ``tryfirst``/``trylast`` reorder).
* ``firstresult`` hooks stop at the first implementation that returns something other than None;
  return None to pass ("this is not mine").
* Hooks run on every rank unless a spec says otherwise, so an implementation must do the same
  thing on every rank (collectives inside a hook must be matched on all ranks).
* Heavy imports (kernels, inference engines) belong inside the hook body, not at the plugin's module level.

The specs live in this package's modules, by concept: `registration` (what a plugin declares:
sections, rules, settings, families and every registry), `training` (model build, micro-batches,
the compute wrapper, loss, step, the ranks' roles), `rollout` (generation, who runs the rewards,
where the experience comes from, how a step's batch is shaped) and `weights`
(checkpoint loading, export). This module is the contract's table of contents: every spec is
importable from it.
"""

import pluggy

PROJECT_NAME = "graft"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

# The spec modules mark their functions with `hookspec` above, so they are imported after it.
from graft.hookspecs.registration import (  # noqa: E402
    graft_advantage_estimators,
    graft_auto_settings,
    graft_cli_commands,
    graft_config_choices,
    graft_config_rules,
    graft_config_sections,
    graft_environments,
    graft_export_formats,
    graft_loss_agg_modes,
    graft_model_families,
    graft_parallel_dims,
    graft_policy_losses,
    graft_preflight,
    graft_reward_functions,
    graft_rollout_corrections,
    graft_rollout_engines,
    graft_trainer_modes,
)
from graft.hookspecs.rollout import (  # noqa: E402
    graft_batch_shaper,
    graft_episode_runner,
    graft_experience_source,
    graft_inference_copy,
    graft_reward_executor,
    graft_rollout_adapter,
    graft_rollout_begin,
    graft_rollout_end,
    graft_static_decoder,
)
from graft.hookspecs.training import (  # noqa: E402
    graft_compute,
    graft_loss_aggregate,
    graft_post_forward,
    graft_pre_shard,
    graft_prepare_inputs,
    graft_rank_roles,
    graft_role_runner,
    graft_step_begin,
    graft_step_end,
    graft_train_begin,
    graft_train_end,
)
from graft.hookspecs.weights import (  # noqa: E402
    graft_ckpt_load,
    graft_ckpt_save,
    graft_export_entries,
    graft_export_slots,
    graft_weights_loaded,
)

__all__ = [
    "PROJECT_NAME",
    "graft_advantage_estimators",
    "graft_auto_settings",
    "graft_batch_shaper",
    "graft_ckpt_load",
    "graft_ckpt_save",
    "graft_compute",
    "graft_config_choices",
    "graft_config_rules",
    "graft_config_sections",
    "graft_environments",
    "graft_episode_runner",
    "graft_experience_source",
    "graft_export_entries",
    "graft_cli_commands",
    "graft_export_formats",
    "graft_export_slots",
    "graft_inference_copy",
    "graft_loss_agg_modes",
    "graft_loss_aggregate",
    "graft_model_families",
    "graft_parallel_dims",
    "graft_policy_losses",
    "graft_post_forward",
    "graft_pre_shard",
    "graft_preflight",
    "graft_prepare_inputs",
    "graft_rank_roles",
    "graft_reward_executor",
    "graft_reward_functions",
    "graft_rollout_adapter",
    "graft_rollout_begin",
    "graft_rollout_corrections",
    "graft_rollout_end",
    "graft_rollout_engines",
    "graft_role_runner",
    "graft_static_decoder",
    "graft_step_begin",
    "graft_step_end",
    "graft_train_begin",
    "graft_train_end",
    "graft_trainer_modes",
    "graft_weights_loaded",
    "hookimpl",
    "hookspec",
]
