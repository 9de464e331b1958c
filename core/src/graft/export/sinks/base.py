"""The sink protocol: where exported weights go (a HF directory, a vLLM engine, a dict...)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch


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


@runtime_checkable
class WeightSink(Protocol):
    """Receives one export. Tensors passed to `consume` are views of a reused buffer: copy what
    you keep before returning. After `abort` the consumer must still hold its previous weights."""

    def begin(self) -> None:
        """An export starts."""

    def consume(self, tensors: list[tuple[str, torch.Tensor]]) -> None:
        """A bucket of full tensors in HF names and layout."""

    def finish(self) -> None:
        """Every tensor was delivered: make the new weights visible, all at once."""

    def abort(self, error: BaseException) -> None:
        """The export failed midway: discard what was staged."""


@runtime_checkable
class DeltaSink(WeightSink, Protocol):
    """A sink that can apply row updates to the weights it already holds."""

    def consume_delta(self, entries: list[DeltaEntry]) -> None:
        """Changed tensors (or rows of them) since the previous export."""


class StagingSink:
    """Copies each bucket out of the exporter's reused buffer into ``_staged`` (CPU) and applies
    nothing until `finish`, so an aborted export leaves the consumer as it was."""

    def __init__(self) -> None:
        self._staged: dict[str, torch.Tensor] = {}

    def begin(self) -> None:
        """Start staging."""
        self._staged = {}

    def consume(self, tensors: list[tuple[str, torch.Tensor]]) -> None:
        """Stage copies of full tensors."""
        for name, tensor in tensors:
            self._staged[name] = tensor.detach().to("cpu", copy=True)

    def abort(self, error: BaseException) -> None:
        """Drop what was staged."""
        self.begin()
