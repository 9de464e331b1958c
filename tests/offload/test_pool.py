"""The host buffer pool: reuse, best fit, the hard ceiling, eviction, pageable fallback, and
the pinned memory it owns (registered with CUDA by the pool itself, never cached elsewhere)."""

from __future__ import annotations

import gc
import logging
import random

import pytest
import torch

from graft_offload.backend import CudaCopyBackend
from graft_offload.pinned import PAGE
from graft_offload.pool import HostBufferPool
from graft_offload.standin import DeferredCopyBackend

CPU = torch.device("cpu")
MIB = 2**20


class CudaRuntimeStandIn:
    """The CUDA runtime's host registration calls (a mock for the GPU): records the page-locked
    ranges, refuses unaligned or overlapping ones and unknown unregistrations."""

    def __init__(self, *, refuse: bool = False) -> None:
        self.registered: dict[int, int] = {}
        self.unregistered = 0
        self.refuse = refuse

    def cudaHostRegister(self, ptr: int, size: int, flags: int) -> int:  # noqa: N802
        if self.refuse:
            return 2  # cudaErrorMemoryAllocation
        assert ptr % PAGE == 0 and size % PAGE == 0 and size > 0
        assert all(ptr + size <= start or start + length <= ptr
                   for start, length in self.registered.items())
        self.registered[ptr] = size
        return 0

    def cudaHostUnregister(self, ptr: int) -> int:  # noqa: N802
        if self.registered.pop(ptr, None) is None:
            return 4
        self.unregistered += 1
        return 0

    def cudaGetErrorString(self, error: int) -> str:  # noqa: N802
        return f"cuda error {error}"

    @property
    def pinned_bytes(self) -> int:
        return sum(self.registered.values())


def test_released_buffers_are_reused_without_new_allocations() -> None:
    backend = DeferredCopyBackend()
    pool = HostBufferPool(10_000, backend)
    for _ in range(3):  # three "steps" of the same shapes
        buffers = [pool.acquire(1000) for _ in range(4)]
        for buffer in buffers:
            pool.release(buffer)
    assert pool.allocations == backend.host_allocations == 4
    assert pool.held_bytes == pool.idle_bytes == 4000


def test_the_smallest_idle_buffer_that_fits_is_taken() -> None:
    pool = HostBufferPool(10_000, DeferredCopyBackend())
    small, large, medium = pool.acquire(100), pool.acquire(3000), pool.acquire(1000)
    for buffer in (small, large, medium):
        pool.release(buffer)
    assert pool.acquire(900) is medium
    assert pool.acquire(900) is large
    assert pool.allocations == 3


def test_the_ceiling_bounds_idle_and_used_bytes() -> None:
    pool = HostBufferPool(2500, DeferredCopyBackend())
    first, second = pool.acquire(1000), pool.acquire(1000)
    assert pool.acquire(1000) is None  # 3000 > 2500: the caller keeps the tensor on the device
    pool.release(first)
    assert pool.acquire(1000) is first
    assert pool.held_bytes == 2000 and second is not None


def test_idle_buffers_too_small_are_freed_least_recently_used_first() -> None:
    backend = DeferredCopyBackend()
    pool = HostBufferPool(3000, backend)
    older, newer = pool.acquire(1000), pool.acquire(1000)
    pool.release(older)
    pool.release(newer)
    large = pool.acquire(2000)  # needs one of the idle 1000-byte buffers freed
    assert large is not None and large.capacity == 2000
    assert pool.held_bytes == 3000
    assert pool.acquire(1000) is newer  # the older one went


def test_nothing_is_freed_when_used_buffers_alone_leave_no_room() -> None:
    pool = HostBufferPool(2000, DeferredCopyBackend())
    used, idle = pool.acquire(1500), pool.acquire(500)
    pool.release(idle)
    assert pool.acquire(1000) is None
    assert pool.idle_bytes == 500 and used is not None


def test_a_zero_ceiling_holds_nothing() -> None:
    pool = HostBufferPool(0, DeferredCopyBackend())
    assert pool.acquire(1) is None and pool.held_bytes == 0


def test_finalizer_returns_are_taken_back_at_the_next_acquire() -> None:
    pool = HostBufferPool(1000, DeferredCopyBackend())
    buffer = pool.acquire(1000)
    pool.release_later(buffer, after=None)
    assert pool.acquire(1000) is buffer


def test_pageable_fallback_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    pool = HostBufferPool(10_000, DeferredCopyBackend(pin_fails=True))
    with caplog.at_level(logging.WARNING, logger="graft.offload"):
        buffers = [pool.acquire(1000) for _ in range(3)]
    assert [b.pinned for b in buffers] == [False] * 3
    assert pool.pinned_bytes == 0 and pool.held_bytes == 3000
    warnings = [r for r in caplog.records if "pageable" in r.getMessage()]
    assert len(warnings) == 1 and "pinning disabled by the stand-in" in warnings[0].getMessage()


def test_close_frees_idle_buffers() -> None:
    pool = HostBufferPool(10_000, DeferredCopyBackend())
    kept, idle = pool.acquire(100), pool.acquire(200)
    pool.release(idle)
    pool.close()
    assert pool.held_bytes == 100 and kept is not None


def test_views_of_a_buffer_have_the_tensors_shape_and_dtype() -> None:
    pool = HostBufferPool(10_000, DeferredCopyBackend())
    buffer = pool.acquire(2 * 3 * 4 * 2)
    view = buffer.view(torch.Size([2, 3, 4]), torch.bfloat16)
    assert view.shape == (2, 3, 4) and view.dtype == torch.bfloat16 and view.is_contiguous()
    assert view.data_ptr() == buffer.storage.data_ptr()


def test_cuda_capacities_are_whole_pages() -> None:
    backend = CudaCopyBackend()
    assert [backend.host_capacity(n) for n in (1, 4096, 4097, 2**28, 2**28 + 1)] == [
        4096, 4096, 8192, 2**28, 2**28 + 4096]


def test_a_buffer_is_freed_only_after_its_last_copy() -> None:
    backend = DeferredCopyBackend()
    pool = HostBufferPool(1000, backend)
    buffer, source = pool.acquire(1000), torch.arange(250.0)
    side = backend.new_stream(CPU)
    backend.wait_event(side, backend.record_event(backend.compute))
    with backend.stream_context(side):
        backend.copy(buffer.view(torch.Size([250]), torch.float32), source)
        done = backend.record_event(side)
    pool.release(buffer, done)
    pool.close()  # the stand-in raises StandInRace if the copy has not run by then
    assert pool.held_bytes == 0 and side.done == len(side.work)


def test_pinned_bytes_never_pass_the_ceiling_over_varied_requests() -> None:
    """Steps of varied sizes through the CUDA backend's own pinned memory: what is registered
    with CUDA is what the pool counts, never above its ceiling, and nothing after close."""
    runtime, limit = CudaRuntimeStandIn(), 10 * MIB
    pool = HostBufferPool(limit, CudaCopyBackend(runtime))
    draw = random.Random(0)
    for _ in range(40):
        leased = []
        for _ in range(draw.randint(1, 12)):
            nbytes = draw.choice([1, PAGE + 1, MIB // 3, MIB, 3 * MIB, 7 * MIB, 11 * MIB])
            buffer = pool.acquire(nbytes)
            assert runtime.pinned_bytes == pool.pinned_bytes == pool.held_bytes <= limit
            if buffer is not None:
                assert buffer.capacity >= nbytes and buffer.storage.data_ptr() % PAGE == 0
                leased.append(buffer)
        for buffer in leased:
            pool.release(buffer)
    assert pool.pinned_bytes > 0 and runtime.unregistered > 0  # the sequence made it evict
    pool.close()
    assert runtime.pinned_bytes == pool.pinned_bytes == pool.held_bytes == 0


def test_a_pool_dropped_without_closing_unregisters_its_memory() -> None:
    runtime = CudaRuntimeStandIn()
    pool = HostBufferPool(10 * MIB, CudaCopyBackend(runtime))
    pool.release(pool.acquire(MIB))
    assert runtime.pinned_bytes == MIB
    del pool
    gc.collect()
    assert runtime.pinned_bytes == 0


def test_memory_cuda_refuses_to_pin_is_pageable_and_counted_so(
        caplog: pytest.LogCaptureFixture) -> None:
    pool = HostBufferPool(10 * MIB, CudaCopyBackend(CudaRuntimeStandIn(refuse=True)))
    with caplog.at_level(logging.WARNING, logger="graft.offload"):
        buffers = [pool.acquire(MIB) for _ in range(2)]
    assert [b.pinned for b in buffers] == [False, False]
    assert pool.pinned_bytes == 0 and pool.held_bytes == 2 * MIB
    assert caplog.text.count("cudaHostRegister: cuda error 2") == 1
