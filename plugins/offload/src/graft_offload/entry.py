"""One block input on its way to host memory and back: the swap entry and its states.

    KEPT         stays on the device (last block, ineligible tensor, no host room)
    COPYING_OUT  copy to the host queued; the device tensor is still held
    ON_HOST      the compute stream waits for the copy; the device tensor is let go
    COPYING_IN   copy back queued into a new device tensor (unpack, or prefetch)
    RESTORED     the compute stream waits for it; the tensor is autograd's again

The entry is what autograd stores for the saved tensor (the pack hook's result), so it lives as
long as the graph that saved it. Its host buffer goes back to the pool when the tensor is
restored, or, if the graph is dropped without a backward pass, when the entry is collected.
The device tensor is never freed explicitly: the entry only drops its own reference, so memory
that anything else still references stays valid. An entry collected while its copy back is in
flight (a failed backward) hands that tensor to ``orphans`` instead: its memory may be reused
only after the compute stream waited for the copy (`graft_offload.offloader.Offloader`).
"""

from __future__ import annotations

import enum
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch

from graft_offload.pool import HostBuffer, HostBufferPool
from graft_offload.transfers import Transfers


class State(enum.Enum):
    KEPT = "kept"
    COPYING_OUT = "copying out"
    ON_HOST = "on host"
    COPYING_IN = "copying in"
    RESTORED = "restored"


@dataclass(eq=False)
class Lease:
    """A host buffer lent to one entry, the event of the last copy that used it, and the device
    tensor a copy back is writing (until the compute stream waited for it)."""

    buffer: HostBuffer
    last_copy: Any = None
    writing: torch.Tensor | None = None
    returned: bool = False

    def give_back(self, pool: HostBufferPool) -> None:
        """Return the buffer to ``pool`` (once)."""
        if not self.returned:
            self.returned = True
            pool.release(self.buffer, self.last_copy)

    def abandon(self, pool: HostBufferPool, orphans: deque[tuple[torch.Tensor, Any]]) -> None:
        """The entry was collected unrestored: queue the buffer's return (finalizers must not
        take locks) and hand over a tensor still being written."""
        if self.writing is not None:
            orphans.append((self.writing, self.last_copy))
            self.writing = None
        if not self.returned:
            self.returned = True
            pool.release_later(self.buffer, self.last_copy)


class SwapEntry:
    """The saved input of block ``block``: where its data is and how to get it back."""

    def __init__(self, block: int, tensor: torch.Tensor, record: Any = None) -> None:
        self.block = block
        self.record = record  # the forward pass's entries by block (for prefetching)
        self.shape = tensor.shape
        self.dtype = tensor.dtype
        self.nbytes = tensor.numel() * tensor.element_size()
        self.state = State.KEPT
        self.device_tensor: torch.Tensor | None = tensor
        self.lease: Lease | None = None
        self.copied_out: Any = None
        self.copied_in: Any = None

    def start_copy_out(self, buffer: HostBuffer, transfers: Transfers, pool: HostBufferPool,
                       orphans: deque[tuple[torch.Tensor, Any]]) -> None:
        """KEPT -> COPYING_OUT: queue the copy into ``buffer``, lent until restored or dropped."""
        assert self.state is State.KEPT and self.device_tensor is not None
        self.lease = Lease(buffer)
        weakref.finalize(self, self.lease.abandon, pool, orphans)
        self.copied_out = transfers.copy_out(self.device_tensor, buffer)
        self.lease.last_copy = self.copied_out
        self.state = State.COPYING_OUT

    def release_device_copy(self, transfers: Transfers) -> None:
        """COPYING_OUT -> ON_HOST: the compute stream waits for the copy, then the entry drops
        its device tensor (memory reused after that wait, in the compute stream's order)."""
        if self.state is not State.COPYING_OUT:
            return
        transfers.wait(self.copied_out)
        self.device_tensor = None
        self.state = State.ON_HOST

    def start_copy_in(self, transfers: Transfers) -> None:
        """ON_HOST -> COPYING_IN: queue the copy back (a prefetch, or the unpack itself)."""
        if self.state is not State.ON_HOST:
            return
        assert self.lease is not None
        # ON_HOST: the compute stream waited for the copy out, and the copy back waits for the
        # compute stream, so it reads the buffer after the copy out wrote it.
        self.device_tensor, self.copied_in = transfers.copy_in(self.lease.buffer, self.shape,
                                                               self.dtype)
        self.lease.last_copy = self.copied_in
        self.lease.writing = self.device_tensor
        self.state = State.COPYING_IN

    def restore(self, transfers: Transfers, pool: HostBufferPool) -> torch.Tensor:
        """The tensor, on the device and safe to read on the compute stream (any state)."""
        if self.state is State.ON_HOST:
            self.start_copy_in(transfers)
        if self.state is State.COPYING_IN:
            transfers.wait(self.copied_in)
        if self.lease is not None:
            self.lease.writing = None
            self.lease.give_back(pool)
        if self.state is not State.KEPT:
            self.state = State.RESTORED
        assert self.device_tensor is not None
        return self.device_tensor
