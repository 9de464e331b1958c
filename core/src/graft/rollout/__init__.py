"""Rollout engines for RL: the trainer's own model (embedded) or a plugin's (graft-vllm's
``vllm``), behind one interface (`graft.rollout.types.RolloutEngine`). Public: `RolloutEngine`,
`RolloutSample`, `SamplingSpec`, `refuse_extras` (an engine's answer to extras it cannot
return) and `cut_at_eos` (a generated row up to its first ``eos``); for
multi-turn environment plugins (``graft_environments``) `Environment`, `EnvironmentFactory`,
`Observation` and `MalformedAction` (`graft.rollout.environment`); for a plugin's attention
implementation, `register_boolean_mask_attention` (the decode loop may run it:
`graft.rollout.decode_attention`).

Importing the package is cheap (the built-in engine registry lives here and loads with every
command); the types import torch when first used.
"""

from typing import Any

__all__ = ["Environment", "EnvironmentFactory", "MalformedAction", "Observation", "RolloutEngine",
           "RolloutSample", "SamplingSpec", "cut_at_eos", "refuse_extras",
           "register_boolean_mask_attention"]
ENVIRONMENT = ("Environment", "EnvironmentFactory", "MalformedAction", "Observation")


def __getattr__(name: str) -> Any:
    if name in ENVIRONMENT:  # no torch: environment plugins import these at module level
        from graft.rollout import environment

        return getattr(environment, name)
    if name == "register_boolean_mask_attention":
        from graft.rollout import decode_attention

        return decode_attention.register_boolean_mask_attention
    if name in __all__:
        from graft.rollout import types

        return getattr(types, name)
    raise AttributeError(f"module 'graft.rollout' has no attribute {name!r}")
