"""The two side streams (device-to-host, host-to-device) and the copies on them, ordered with events.

Every copy waits for an event recorded on the compute stream at the moment it is queued, so it
reads (or overwrites) device memory only after the compute work queued before it; a copy into a
host buffer also waits for the buffer's previous copy; the compute stream waits for a copy's
event before it frees the copied tensor's memory or reads the restored one. A copy back needs
no wait of its own for its copy out: it starts only once the compute stream waited for that
copy (`graft_offload.entry`), and it waits for the compute stream. The compute stream is looked
up on every call (never cached) and always outside the side streams' contexts, where the
current stream would be the side stream itself. The streams are made on the device of the
first tensor copied out, unless a device is given (`bind`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from graft_offload.backend import CopyBackend
from graft_offload.pool import HostBuffer

D2H, H2D = "d2h", "h2d"


@dataclass
class CopyTimes:
    """Timing events of one step's copies and compute-stream waits (only when timing is on)."""

    copies: list[tuple[str, int, Any, Any]] = field(default_factory=list)  # (direction, bytes, start, end)
    waits: list[tuple[Any, Any]] = field(default_factory=list)  # (before, after) on the compute stream
    block_starts: list[Any] = field(default_factory=list)  # compute stream, as each copy out is queued


class Transfers:
    """Queue copies of tensors between the device and host buffers on ``device``'s side streams."""

    def __init__(self, backend: CopyBackend, device: torch.device | None = None, *,
                 timing: bool = False) -> None:
        self.backend = backend
        self.timing = timing
        self.device: torch.device | None = None
        self.d2h_stream: Any = None
        self.h2d_stream: Any = None
        self.times = CopyTimes()
        if device is not None:
            self.bind(device)

    @property
    def bound(self) -> bool:
        """Whether the side streams exist (`bind` was called)."""
        return self.device is not None

    def bind(self, device: torch.device) -> None:
        """Make the side streams on ``device`` (once; a model built on the meta device learns
        its device only at its first forward)."""
        if self.device is None:
            self.d2h_stream = self.backend.new_stream(device)
            self.h2d_stream = self.backend.new_stream(device)
            self.device = device

    def copy_out(self, tensor: torch.Tensor, buffer: HostBuffer) -> Any:
        """Queue ``tensor`` -> ``buffer`` after the compute work queued so far (and after the
        buffer's previous copy, which may be a copy back still reading it: one whose graph was
        dropped during its backward); returns the event that marks the copy done. Binds the
        streams to ``tensor``'s device if they are not yet."""
        self.bind(tensor.device)
        backend = self.backend
        produced = backend.record_event(self._compute(), timing=self.timing)
        if self.timing:
            self.times.block_starts.append(produced)
        backend.wait_event(self.d2h_stream, produced)
        if buffer.free_after is not None:
            backend.wait_event(self.d2h_stream, buffer.free_after)
        host = buffer.view(tensor.shape, tensor.dtype)
        return self._copy_on(self.d2h_stream, D2H, host, tensor)

    def copy_in(self, buffer: HostBuffer, shape: torch.Size, dtype: torch.dtype
                ) -> tuple[torch.Tensor, Any]:
        """A new device tensor filled from ``buffer``, after the compute work queued so far (the
        caller's compute stream already waited for the buffer's copy out); returns it and the
        event that marks the copy done. The tensor is allocated for the compute stream, so the
        caching allocator reuses its memory in that stream's order: the copy must not write it
        before the compute work queued before it is done with that memory."""
        backend = self.backend
        compute = self._compute()
        tensor = backend.empty(shape, dtype, self.device)
        backend.wait_event(self.h2d_stream, backend.record_event(compute))
        return tensor, self._copy_on(self.h2d_stream, H2D, tensor, buffer.view(shape, dtype))

    def wait(self, event: Any) -> None:
        """Make the compute stream wait for ``event`` (the host does not block)."""
        backend = self.backend
        compute = self._compute()
        before = backend.record_event(compute, timing=True) if self.timing else None
        backend.wait_event(compute, event)
        if self.timing:
            self.times.waits.append((before, backend.record_event(compute, timing=True)))

    def take_times(self) -> CopyTimes:
        """This step's timing events, handed over and forgotten."""
        times, self.times = self.times, CopyTimes()
        return times

    def _compute(self) -> Any:
        return self.backend.current_stream(self.device)

    def _copy_on(self, stream: Any, direction: str, dst: torch.Tensor, src: torch.Tensor) -> Any:
        backend = self.backend
        with backend.stream_context(stream):
            start = backend.record_event(stream, timing=True) if self.timing else None
            backend.copy(dst, src)
            done = backend.record_event(stream, timing=self.timing)
        if self.timing:
            self.times.copies.append((direction, src.numel() * src.element_size(), start, done))
        return done
