"""Rollout engines for RL: the trainer's own model (embedded), vLLM, or a plugin's, behind one
interface (`graft.rollout.types.RolloutEngine`). Public: `RolloutEngine`, `RolloutSample`,
`SamplingSpec` and `refuse_extras` (an engine's answer to extras it cannot return); for
multi-turn environment plugins (``graft_environments``) `Environment`, `EnvironmentFactory`,
`Observation` and `MalformedAction` (`graft.rollout.environment`).

Importing the package is cheap (the built-in engine registry lives here and loads with every
command); the types import torch when first used.
"""

from typing import Any

__all__ = ["Environment", "EnvironmentFactory", "MalformedAction", "Observation", "RolloutEngine",
           "RolloutSample", "SamplingSpec", "refuse_extras"]
ENVIRONMENT = ("Environment", "EnvironmentFactory", "MalformedAction", "Observation")


def __getattr__(name: str) -> Any:
    if name in ENVIRONMENT:  # no torch: environment plugins import these at module level
        from graft.rollout import environment

        return getattr(environment, name)
    if name in __all__:
        from graft.rollout import types

        return getattr(types, name)
    raise AttributeError(f"module 'graft.rollout' has no attribute {name!r}")
