"""graft-multiturn: RL samples as multi-turn episodes, the model and an environment plugin's
tools taking turns (entry point ``multiturn``, section ``features.multiturn``,
`MultiturnConfig`).

Public: for environment plugins (the core's ``graft_environments`` registry) the protocol they
implement, `Environment`, `EnvironmentFactory`, `Observation` and `MalformedAction`
(`graft_multiturn.environment`, no torch); the runner the plugin's ``graft_episode_runner``
builds, `EpisodeRunner`, `EpisodeBatch` and `EpisodeLimits` (`graft_multiturn.episodes`, loaded
on first use: they import torch); `environments` (the registry's factories by name) and
`build_episode_runner` (the runner a config asks for). `graft_multiturn.templates`: chat
templates like the public families' (Hermes-style, thinking, harmony) to test environments on.
"""

from graft import lazy_attributes
from graft_multiturn.config import MultiturnConfig
from graft_multiturn.environment import (
    Environment,
    EnvironmentFactory,
    MalformedAction,
    Observation,
)

__version__ = "0.1.0"

__all__ = ["Environment", "EnvironmentFactory", "EpisodeBatch", "EpisodeLimits", "EpisodeRunner",
           "MalformedAction", "MultiturnConfig", "Observation", "__version__",
           "build_episode_runner", "environments"]

# torch (the episodes) and the plugin manager (the runner) load on first use
_LAZY = {"EpisodeBatch": "graft_multiturn.episodes", "EpisodeLimits": "graft_multiturn.episodes",
         "EpisodeRunner": "graft_multiturn.episodes", "build_episode_runner": "graft_multiturn.runner",
         "environments": "graft_multiturn.runner"}


__getattr__ = lazy_attributes(__name__, _LAZY)
