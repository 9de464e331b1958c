"""The sink protocol: where exported weights go (a HF directory, a dict, a plugin's inference
engine...), and the filter protocol: what an exporter may leave out or send otherwise."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from graft.errors import GraftError


@dataclass(frozen=True)
class RowBlock:
    """Rows ``[row_offset, row_offset + len(values))`` (dim 0) of the HF tensor ``name``, whose
    whole shape is ``full_shape``: one ``ep`` rank's block of a fused experts tensor, streamed
    without ever building the whole tensor on the device. A full export delivers every block of
    a tensor exactly once; the sink assembles them."""

    name: str
    values: torch.Tensor
    row_offset: int
    full_shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        """Bytes this block carries."""
        return self.values.numel() * self.values.element_size()


class RowAssembler:
    """Whole tensors from their `RowBlock`s, in host memory (``device``; None: on the device
    each tensor's blocks arrive on)."""

    def __init__(self, device: torch.device | str | None = "cpu") -> None:
        self.device = None if device is None else torch.device(device)
        self._partial: dict[str, tuple[torch.Tensor, int]] = {}  # name -> (tensor, rows filled)

    def add(self, block: RowBlock) -> torch.Tensor | None:
        """Copy ``block`` in (it may be a reused buffer); the whole tensor once its last rows
        arrived, else None."""
        tensor, filled = self._partial.get(block.name, (None, 0))
        if tensor is None or tuple(tensor.shape) != tuple(block.full_shape):
            tensor = torch.empty(block.full_shape, dtype=block.values.dtype,
                                 device=self.device or block.values.device)
            filled = 0
        rows = block.values.shape[0]
        if block.row_offset < 0 or block.row_offset + rows > tensor.shape[0]:
            raise GraftError(f"export: rows {block.row_offset}..{block.row_offset + rows} of "
                             f"{block.name} fall outside its shape {tuple(block.full_shape)}")
        tensor[block.row_offset:block.row_offset + rows].copy_(block.values)
        filled += rows
        if filled == tensor.shape[0]:
            self._partial.pop(block.name, None)
            return tensor
        self._partial[block.name] = (tensor, filled)
        return None

    def check_complete(self) -> None:
        """A `GraftError` naming the tensors some of whose rows never arrived."""
        if self._partial:
            names = ", ".join(sorted(self._partial))
            raise GraftError(f"export: rows of {names} never arrived; the export is incomplete")

    def clear(self) -> None:
        """Forget partially assembled tensors."""
        self._partial = {}


@runtime_checkable
class WeightSink(Protocol):
    """Receives one export. Tensors passed to `consume` are views of a reused buffer: copy what
    you keep before returning. After `abort` the consumer must still hold its previous weights.

    A sink may declare a ``consumer`` attribute (`graft.export.CONSUMERS`: ``hf``, the
    default, or ``inference``): handlers produce the names and layouts that consumer loads. A sink
    with ``consume_rows`` takes the blocks of expert-parallel fused tensors as they stream; one
    without it gets them as whole tensors (the exporter assembles them first, on the device).
    """

    def begin(self) -> None:
        """An export starts."""

    def consume(self, tensors: list[tuple[str, torch.Tensor]]) -> None:
        """A bucket of full tensors in HF names and layout."""

    def finish(self) -> None:
        """Every tensor was delivered: make the new weights visible, all at once."""

    def abort(self, error: BaseException) -> None:
        """The export failed midway: discard what was staged."""


@runtime_checkable
class UpdateSink(WeightSink, Protocol):
    """A sink that applies the updates an `ExportFilter` makes (graft-vllm's changed rows)."""

    def consume_updates(self, updates: list[Any]) -> None:
        """Updates from the exporter's filter, in export order, each on its own (outside the
        bucket); like buckets, they take effect at ``finish``."""


@runtime_checkable
class RowSink(WeightSink, Protocol):
    """A sink that assembles tensors from their row blocks itself."""

    def consume_rows(self, blocks: list[RowBlock]) -> None:
        """Row blocks of tensors (views of a reused buffer: copy them)."""


@runtime_checkable
class ExportFilter(Protocol):
    """Sees every entry of an export on the exporting rank before it is bucketed, and decides
    what is sent for it: a delta export (graft-vllm's ``features.vllm.delta``) sends only what
    changed since the last export.

    Given to `graft.export.WeightExporter` as ``entry_filter``, it lives as long as the
    exporter, so it may keep state from one export to the next. An exporter with a filter
    streams every export parameter by parameter (it never follows a copy plan), on every rank.
    What `tensor` and `rows` return:

    * None: nothing is sent for this entry;
    * a ``torch.Tensor`` (from `tensor`) or a `RowBlock` (from `rows`): it travels in the
      bucket as a full export's entry would, under the entry's name (the entry itself, or a
      replacement of the same name);
    * anything else: an update with an ``nbytes`` attribute (bytes it carries), handed to the
      sink's ``consume_updates`` on its own (the sink must be an `UpdateSink`; any other is a
      ``TypeError``) and counted as sent.
    """

    def begin(self) -> bool:
        """An export starts (on every rank, before any entry); True when it may send less
        than every entry (``ExportStats.partial`` of `WeightExporter.export`)."""

    def tensor(self, name: str, tensor: torch.Tensor) -> Any:
        """What to send for the whole tensor ``name`` (HF name, the sink consumer's layout).
        ``tensor`` may be a view of the model or of a reused buffer: copy what you keep."""

    def rows(self, block: RowBlock) -> Any:
        """What to send for one row block of an expert-parallel fused tensor (only for sinks
        with ``consume_rows``; others get whole tensors through `tensor`). ``block.values``
        may be a reused receive buffer: copy what you keep."""


class StagingSink:
    """Copies each bucket out of the exporter's reused buffer into ``staged`` (CPU tensors by HF
    name) and applies nothing until `finish`, so an aborted export leaves the consumer as it was.

    A subclass implements ``finish``: `check_complete` first, then apply ``staged`` to its
    consumer. ``staged`` is emptied by `begin` and `abort`.
    """

    def __init__(self) -> None:
        self.staged: dict[str, torch.Tensor] = {}
        self._rows = RowAssembler()

    def begin(self) -> None:
        """Start staging."""
        self.staged = {}
        self._rows.clear()

    def check_complete(self) -> None:
        """A `GraftError` naming the tensors some of whose row blocks never arrived; call it in
        ``finish`` before applying ``staged``."""
        self._rows.check_complete()

    def consume(self, tensors: list[tuple[str, torch.Tensor]]) -> None:
        """Stage copies of full tensors."""
        for name, tensor in tensors:
            self.staged[name] = tensor.detach().to("cpu", copy=True)

    def consume_rows(self, blocks: list[RowBlock]) -> None:
        """Assemble row blocks into staged host tensors."""
        for block in blocks:
            whole = self._rows.add(block)
            if whole is not None:
                self.staged[block.name] = whole

    def abort(self, error: BaseException) -> None:
        """Drop what was staged."""
        self.begin()


class StateDictSink(StagingSink):
    """An in-memory consumer: keeps the exported weights in ``self.weights`` (HF names, CPU).

    What a library user iterating over exports wants, and the reference consumer in tests.
    """

    def __init__(self) -> None:
        super().__init__()
        self.weights: dict[str, torch.Tensor] = {}

    def finish(self) -> None:
        """Apply everything staged at once."""
        self.check_complete()
        self.weights.update(self.staged)
        self.begin()
