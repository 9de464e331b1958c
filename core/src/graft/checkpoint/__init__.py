"""Distributed checkpoints: atomic DCP saves, verified loads, exact resume, resharding.

The package module imports nothing heavy; `graft.checkpoint.manager.CheckpointManager` does the
work (it imports torch).
"""

from graft.checkpoint.context import LoadContext

__all__ = ["LoadContext"]
