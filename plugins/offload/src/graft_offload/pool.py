"""The capped pool of host buffers that offloaded block inputs live in.

Buffers are allocated once (pinned where the backend can) and reused step after step: a request
takes the smallest idle buffer that is large enough, allocates a new one only while the total
stays under the ceiling, and otherwise frees idle buffers (least recently used first) to make
room. When nothing fits, `acquire` returns None and the caller keeps the tensor on the device.
The ceiling bounds every byte the pool holds, idle or in use; the backend's allocations are the
pool's own (`graft_offload.pinned`), so a freed buffer is no longer held by anything.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

logger = logging.getLogger("graft.offload")


@dataclass(eq=False)
class HostBuffer:
    """``capacity`` bytes of host memory (``storage``: a uint8 tensor), pinned or pageable.

    ``free_after`` is the event of the last copy that used the buffer (None: none pending); a
    new copy into it must wait for that event first.
    """

    storage: torch.Tensor
    capacity: int
    pinned: bool
    free_after: Any = None

    def view(self, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        """The first bytes of the buffer as a contiguous tensor of ``shape`` and ``dtype``."""
        nbytes = shape.numel() * dtype.itemsize
        return self.storage[:nbytes].view(dtype).view(shape)


class HostAllocator(Protocol):
    """What the pool needs from a copy backend to get and give back host memory."""

    def host_capacity(self, nbytes: int) -> int:
        """The bytes an allocation of ``nbytes`` really takes (its allocator's rounding)."""

    def allocate_host(self, nbytes: int) -> tuple[torch.Tensor, str | None]:
        """``nbytes`` of host memory as a uint8 tensor, and None when it is pinned or the reason
        pinning failed (the memory is then pageable)."""

    def synchronize_event(self, event: Any) -> None:
        """Block the host until the work before ``event`` is done."""

    def free_host(self, buffer: HostBuffer) -> None:
        """Give ``buffer`` back; its last copy (``free_after``) is done."""


class HostBufferPool:
    """Host buffers for offloaded tensors, at most ``limit_bytes`` in total."""

    def __init__(self, limit_bytes: int, allocator: HostAllocator) -> None:
        if limit_bytes < 0:
            raise ValueError(f"limit_bytes must be >= 0, got {limit_bytes}")
        self.limit_bytes = limit_bytes
        self.allocator = allocator
        self.held_bytes = 0  # idle + in use
        self.pinned_bytes = 0
        self.allocations = 0  # host allocations made so far (reuse keeps this flat)
        self._idle: list[HostBuffer] = []  # least recently released first
        self._returned: deque[tuple[HostBuffer, Any]] = deque()
        self._lock = threading.Lock()
        self._warned_pageable = False

    def acquire(self, nbytes: int) -> HostBuffer | None:
        """A buffer of at least ``nbytes`` bytes, or None when the ceiling leaves no room."""
        with self._lock:
            self._take_returns()
            fitting = [b for b in self._idle if b.capacity >= nbytes]
            if fitting:
                buffer = min(fitting, key=lambda b: b.capacity)
                self._idle.remove(buffer)
                return buffer
            size = self.allocator.host_capacity(nbytes)
            if not self._make_room(size):
                return None
            return self._allocate(size)

    def release(self, buffer: HostBuffer, after: Any = None) -> None:
        """Take ``buffer`` back; ``after`` is the event of its last copy (None: no copy pending)."""
        with self._lock:
            buffer.free_after = after
            self._idle.append(buffer)

    def release_later(self, buffer: HostBuffer, after: Any = None) -> None:
        """`release` for finalizers and other threads: queued, taken back at the next `acquire`
        (never blocks, never re-enters the pool)."""
        self._returned.append((buffer, after))

    def close(self) -> None:
        """Free every idle buffer (buffers still in use are freed when they come back)."""
        with self._lock:
            self._take_returns()
            for buffer in list(self._idle):
                self._free(buffer)

    @property
    def idle_bytes(self) -> int:
        """Bytes held by buffers nobody uses now."""
        self._flush_returns()
        return sum(b.capacity for b in self._idle)

    def _flush_returns(self) -> None:
        with self._lock:
            self._take_returns()

    def _take_returns(self) -> None:
        while self._returned:
            buffer, after = self._returned.popleft()
            buffer.free_after = after
            self._idle.append(buffer)

    def _make_room(self, size: int) -> bool:
        idle = sum(b.capacity for b in self._idle)
        if self.held_bytes - idle + size > self.limit_bytes:
            return False  # buffers in use alone leave no room: free nothing
        while self.held_bytes + size > self.limit_bytes:
            self._free(self._idle[0])
        return True

    def _allocate(self, size: int) -> HostBuffer:
        storage, pin_failure = self.allocator.allocate_host(size)
        if pin_failure is not None and not self._warned_pageable:
            self._warned_pageable = True
            logger.warning("graft-offload: pinning %d bytes of host memory failed (%s); using "
                           "pageable memory, whose copies are slower and not asynchronous",
                           size, pin_failure)
        buffer = HostBuffer(storage, size, pinned=pin_failure is None)
        self.held_bytes += size
        self.pinned_bytes += size if buffer.pinned else 0
        self.allocations += 1
        return buffer

    def _free(self, buffer: HostBuffer) -> None:
        self._idle.remove(buffer)
        if buffer.free_after is not None:  # a copy may still be reading or writing it
            self.allocator.synchronize_event(buffer.free_after)
        self.allocator.free_host(buffer)
        self.held_bytes -= buffer.capacity
        self.pinned_bytes -= buffer.capacity if buffer.pinned else 0
