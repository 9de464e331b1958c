"""Config: Hydra structured configs (dataclasses + OmegaConf), plugin sections, validation."""

from graft.config.compose import compose, schema_config, to_yaml
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
    "ModelConfig",
    "OptimConfig",
    "Range",
    "RolloutConfig",
    "TrainerConfig",
    "ValConfig",
    "bounded",
    "choice",
    "compose",
    "schema_config",
    "to_yaml",
]
