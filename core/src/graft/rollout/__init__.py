"""Rollout engines for RL: the trainer's own model (embedded), vLLM, or a plugin's, behind one
interface (`graft.rollout.types.RolloutEngine`). Public: `RolloutEngine`, `RolloutSample`,
`SamplingSpec` and `refuse_extras` (an engine's answer to extras it cannot return).

Importing the package is cheap (the built-in engine registry lives here and loads with every
command); the types import torch when first used.
"""

from typing import Any

__all__ = ["RolloutEngine", "RolloutSample", "SamplingSpec", "refuse_extras"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from graft.rollout import types

        return getattr(types, name)
    raise AttributeError(f"module 'graft.rollout' has no attribute {name!r}")
