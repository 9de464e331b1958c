"""Delta export: compare each HF tensor with the last exported one and send only changed rows.

The snapshot of the last export lives in host memory (pinned on GPU) on the exporting rank.
With fp32 master weights and small RL learning rates, many bf16 values do not change from one
step to the next, so many rows (experts, vocabulary rows) need not be sent.
"""

from __future__ import annotations

import torch

from graft.export.sinks.base import DeltaEntry


class DeltaTracker:
    """Remembers the last exported value of every HF tensor."""

    def __init__(self) -> None:
        self.snapshot: dict[str, torch.Tensor] = {}

    def diff(self, name: str, tensor: torch.Tensor) -> DeltaEntry | None:
        """The update for ``name`` (None when nothing changed); records the new value."""
        previous = self.snapshot.get(name)
        if previous is None or previous.shape != tensor.shape or previous.dtype != tensor.dtype:
            self._remember(name, tensor)
            return DeltaEntry(name, tensor)
        old = previous.to(tensor.device, non_blocking=True)
        rows = tensor.reshape(tensor.shape[0] if tensor.dim() else 1, -1)
        changed = (rows != old.reshape(rows.shape)).any(dim=1).nonzero().flatten()
        if changed.numel() == 0:
            return None
        if changed.numel() == rows.shape[0] or tensor.dim() == 0:
            self._remember(name, tensor)
            return DeltaEntry(name, tensor)
        values = tensor[changed]
        previous[changed.cpu()] = values.cpu()
        return DeltaEntry(name, values, changed)

    def _remember(self, name: str, tensor: torch.Tensor) -> None:
        copy = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu",
                           pin_memory=tensor.is_cuda)
        copy.copy_(tensor)
        self.snapshot[name] = copy
