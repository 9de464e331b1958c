"""Delta export (``features.vllm.delta``): compare each HF tensor with the last exported one and
send only changed rows.

`DeltaTracker` is the exporter's `graft.export.ExportFilter`
(``WeightExporter(entry_filter=DeltaTracker())``): a new or wholly changed tensor travels in the
bucket as in a full export, an unchanged one is dropped, and the changed rows of any other go to
the sink as a `DeltaEntry` (its ``consume_updates``: `graft_vllm.sink.VLLMSink`, or
`StateDictDeltaSink`).

The snapshot of the last export lives in host memory (pinned on GPU) on the exporting rank.
With fp32 master weights and small RL learning rates, many bf16 values do not change from one
step to the next, so many rows (experts, vocabulary rows) need not be sent. Expert-parallel fused
tensors arrive as row blocks (`graft.export.RowBlock`) and are compared block by block, never
whole.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from graft.export import RowBlock, StagingSink
from graft_vllm.fused_experts import split_fused


@dataclass
class DeltaEntry:
    """A changed HF tensor: all of it (``rows`` None) or the rows at ``rows`` (dim 0)."""

    name: str
    values: torch.Tensor
    rows: torch.Tensor | None = None

    @property
    def nbytes(self) -> int:
        """Bytes this entry carries (values plus row indices)."""
        extra = 0 if self.rows is None else self.rows.numel() * self.rows.element_size()
        return self.values.numel() * self.values.element_size() + extra


class DeltaTracker:
    """Remembers the last exported value of every HF tensor; the exporter's filter."""

    def __init__(self) -> None:
        self.snapshot: dict[str, torch.Tensor] = {}
        # Tensors whose row blocks are still arriving for the first time: name -> rows filled.
        self._filling: dict[str, int] = {}

    def begin(self) -> bool:
        """An export starts: forget tensors a failed export left half recorded (they are sent
        whole again). True when a snapshot exists (this export may send only changes)."""
        partial = bool(self.snapshot)
        for name in self._filling:
            self.snapshot.pop(name, None)
        self._filling = {}
        return partial

    def tensor(self, name: str, tensor: torch.Tensor) -> torch.Tensor | DeltaEntry | None:
        """The exporter's question for a whole tensor: ``tensor`` itself when it is new or
        changed everywhere (it travels in the bucket), its changed rows, or None."""
        entry = self.diff(name, tensor)
        if entry is None or entry.rows is not None:
            return entry
        return entry.values

    def rows(self, block: RowBlock) -> RowBlock | DeltaEntry | None:
        """The exporter's question for a row block: `diff_rows`."""
        return self.diff_rows(block)

    def diff(self, name: str, tensor: torch.Tensor) -> DeltaEntry | None:
        """The update for ``name`` (None when nothing changed); records the new value.

        A per-expert name (``...experts.<id>.<param>``) whose fused tensor is in the snapshot
        (the previous export was in the fused layout) is compared with that expert's rows.
        """
        split_fused(self.snapshot, name)
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

    def diff_rows(self, block: RowBlock) -> DeltaEntry | RowBlock | None:
        """The update for one row block: the block itself while the consumer does not have its
        tensor yet (a full export sends every block of it), the changed rows (global row ids)
        as a `DeltaEntry`, or None when none changed; records the new rows."""
        previous = self.snapshot.get(block.name)
        values = block.values
        end = block.row_offset + values.shape[0]
        if (previous is None or tuple(previous.shape) != tuple(block.full_shape)
                or previous.dtype != values.dtype):
            previous = torch.empty(block.full_shape, dtype=values.dtype, device="cpu",
                                   pin_memory=values.is_cuda)
            self.snapshot[block.name] = previous
            self._filling[block.name] = 0
        if block.name in self._filling:
            previous[block.row_offset:end].copy_(values)
            self._filling[block.name] += values.shape[0]
            if self._filling[block.name] >= previous.shape[0]:
                del self._filling[block.name]
            return block
        span = previous[block.row_offset:end]
        rows = values.reshape(values.shape[0], -1)
        old = span.to(values.device, non_blocking=True).reshape(rows.shape)
        changed = (rows != old).any(dim=1).nonzero().flatten()
        if changed.numel() == 0:
            return None
        changed_values = values[changed]
        span[changed.cpu()] = changed_values.cpu()
        return DeltaEntry(block.name, changed_values, changed + block.row_offset)

    def _remember(self, name: str, tensor: torch.Tensor) -> None:
        copy = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu",
                           pin_memory=tensor.is_cuda)
        copy.copy_(tensor)
        self.snapshot[name] = copy


class StateDictDeltaSink(StagingSink):
    """An in-memory consumer of full and delta exports: ``self.weights`` (HF names, CPU).

    The reference consumer of delta exports in tests (a delta export applied to it must give
    exactly what a full export gives), and a dict for library users who export deltas.
    """

    def __init__(self) -> None:
        super().__init__()
        self.weights: dict[str, torch.Tensor] = {}
        self._staged_rows: list[DeltaEntry] = []

    def begin(self) -> None:
        """Start staging."""
        super().begin()
        self._staged_rows = []

    def consume_updates(self, updates: list[DeltaEntry]) -> None:
        """Stage row updates (applied in `finish`)."""
        for entry in updates:
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
