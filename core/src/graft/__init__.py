"""Graft: a plugin framework for LLM post-training (RL and SFT) on PyTorch.

Plugin authors need `hookimpl` (and `graft.config.choice`, `graft.testing`, and `TrainingJob`,
the protocol a ``graft_trainer_modes`` factory's job follows); library users call
`graft.config.compose` and the training API. Importing ``graft`` is cheap: no torch (the config
is imported, to be told where the process's plugins are).
"""

from typing import Any

from graft._version import __version__
from graft.config.hooks import use_process_manager
from graft.hookspecs import hookimpl
from graft.lazy import lazy_attributes

__all__ = ["Trainer", "TrainingJob", "__version__", "build_model", "compose", "hookimpl",
           "lazy_attributes", "parallelize", "train"]

# The training API imports torch; it is loaded on first access.
_LAZY = {
    "train": "graft.training.trainer",
    "Trainer": "graft.training.trainer",
    "TrainingJob": "graft.training.job",
    "build_model": "graft.models.build",
    "parallelize": "graft.engine.distributed.parallelize",
    "compose": "graft.config.compose",
}

__getattr__ = lazy_attributes(__name__, _LAZY)


def _process_plugin_manager() -> Any:
    from graft.plugins import get_plugin_manager

    return get_plugin_manager()


# graft.config imports no other graft package: a config call given no plugin manager gets the
# process's through this (the composition root), loaded on first use.
use_process_manager(_process_plugin_manager)
