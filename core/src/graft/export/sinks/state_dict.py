"""`StateDictSink`: an in-memory consumer (a dict of CPU tensors), full or delta.

What a library user iterating over exports wants, and the reference consumer in tests: applying a
delta export to it must give exactly what a full export gives.
"""

from __future__ import annotations

import torch

from graft.export.sinks.base import DeltaEntry, StagingSink


class StateDictSink(StagingSink):
    """Keeps the exported weights in ``self.weights`` (HF names, CPU)."""

    def __init__(self) -> None:
        super().__init__()
        self.weights: dict[str, torch.Tensor] = {}
        self._staged_rows: list[DeltaEntry] = []

    def begin(self) -> None:
        """Start staging."""
        super().begin()
        self._staged_rows = []

    def consume_delta(self, entries: list[DeltaEntry]) -> None:
        """Stage row updates (applied in `finish`)."""
        for entry in entries:
            if entry.rows is None:
                self.staged[entry.name] = entry.values.detach().to("cpu", copy=True)
            else:
                self._staged_rows.append(DeltaEntry(entry.name, entry.values.detach().cpu(),
                                                    entry.rows.detach().cpu()))

    def finish(self) -> None:
        """Apply everything staged at once."""
        self.check_complete()
        self.weights.update(self.staged)
        for entry in self._staged_rows:
            self.weights[entry.name][entry.rows] = entry.values
        self.begin()
