"""Config: Hydra structured configs (dataclasses + OmegaConf), plugin sections, validation.

A leaf: it imports no other graft package; it reaches the plugins through the manager it is
given (`graft.config.hooks`).
"""

from graft.config.compose import compose, schema_config, to_yaml, valid_choices
from graft.config.keys import MOVED_KEYS, MovedKey, describe_type, register_moved_key, was_set
from graft.config.ranges import Range, bounded
from graft.config.schema import (
    AlgorithmConfig,
    CheckpointConfig,
    DataConfig,
    EngineConfig,
    ExportConfig,
    GraftConfig,
    LossConfig,
    ModelConfig,
    OptimConfig,
    RolloutConfig,
    TrainerConfig,
    ValConfig,
    choice,
)

__all__ = [
    "AlgorithmConfig",
    "CheckpointConfig",
    "DataConfig",
    "EngineConfig",
    "ExportConfig",
    "GraftConfig",
    "LossConfig",
    "MOVED_KEYS",
    "ModelConfig",
    "MovedKey",
    "OptimConfig",
    "Range",
    "RolloutConfig",
    "TrainerConfig",
    "ValConfig",
    "bounded",
    "choice",
    "compose",
    "describe_type",
    "register_moved_key",
    "schema_config",
    "to_yaml",
    "valid_choices",
    "was_set",
]
