"""Graft: a plugin framework for LLM post-training (RL and SFT) on PyTorch.

Plugin authors need `hookimpl` (and `graft.config.choice`, `graft.testing`); library users call
`graft.config.compose` and the training API. Importing ``graft`` is cheap: no torch.
"""

from graft._version import __version__
from graft.hookspecs import hookimpl

__all__ = ["__version__", "hookimpl"]
