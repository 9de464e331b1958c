"""The CPU stand-in for the device: side-stream copies run only once awaited, like a GPU's may,
and a copy queued out of order with the work it conflicts with is a `StandInRace`."""

from __future__ import annotations

import pytest
import torch

from graft_offload.pool import HostBuffer
from graft_offload.standin import DeferredCopyBackend, StandInRace

CPU = torch.device("cpu")


def host_floats(backend: DeferredCopyBackend, count: int = 4) -> torch.Tensor:
    return backend.allocate_host(4 * count)[0].view(torch.float32)


def copy_on(backend: DeferredCopyBackend, stream, dst: torch.Tensor, src: torch.Tensor):
    """Queue ``dst <- src`` on ``stream`` after all compute work so far; its event."""
    backend.wait_event(stream, backend.record_event(backend.compute))
    with backend.stream_context(stream):
        backend.copy(dst, src)
        return backend.record_event(stream)


def test_a_side_stream_copy_runs_when_the_compute_stream_waits_for_it() -> None:
    backend = DeferredCopyBackend()
    side = backend.new_stream(CPU)
    source, host = torch.arange(4.0), host_floats(backend)
    with backend.stream_context(side):
        assert backend.current_stream(CPU) is side
    done = copy_on(backend, side, host, source)
    assert backend.current_stream(CPU) is backend.compute
    assert host.isnan().all()  # host memory starts as NaN bytes; the copy has not run
    backend.wait_event(backend.compute, done)
    assert torch.equal(host, source)


def test_a_copy_whose_source_was_released_reads_garbage() -> None:
    backend = DeferredCopyBackend()
    host = host_floats(backend)
    copy_on(backend, backend.new_stream(CPU), host, torch.arange(4.0))  # nothing holds the source
    backend.synchronize()
    assert host.isnan().all()


def test_device_memory_is_handed_out_uninitialised() -> None:
    tensor = DeferredCopyBackend().empty(torch.Size([3]), torch.bfloat16, CPU)
    assert tensor.dtype == torch.bfloat16 and tensor.isnan().all()


def test_host_buffers_are_not_device_tensors() -> None:
    backend = DeferredCopyBackend()
    host = backend.allocate_host(16)[0]
    assert not backend.is_device_tensor(host) and not backend.is_device_tensor(host[4:])
    assert backend.is_device_tensor(torch.zeros(4))


def test_a_copy_reading_device_memory_must_wait_for_the_compute_work_before_it() -> None:
    backend = DeferredCopyBackend()
    side, host = backend.new_stream(CPU), host_floats(backend)
    source = torch.arange(4.0)
    ready = backend.record_event(backend.compute)
    backend.wait_event(side, ready)
    backend.record_event(backend.compute)  # more compute work, which may write the source
    with backend.stream_context(side), pytest.raises(StandInRace, match="reads device memory"):
        backend.copy(host, source)


def test_a_copy_writing_fresh_device_memory_must_wait_for_the_compute_work_before_it() -> None:
    backend = DeferredCopyBackend()
    side, host = backend.new_stream(CPU), host_floats(backend)
    backend.wait_event(side, backend.record_event(backend.compute))
    fresh = backend.empty(torch.Size([4]), torch.float32, CPU)  # earlier compute work may use it
    with backend.stream_context(side), pytest.raises(StandInRace, match="writes device memory"):
        backend.copy(fresh, host)


def test_a_host_buffer_is_read_only_after_the_copy_that_writes_it() -> None:
    backend = DeferredCopyBackend()
    out, back = backend.new_stream(CPU), backend.new_stream(CPU)
    host, source = host_floats(backend), torch.arange(4.0)
    copy_on(backend, out, host, source)
    with pytest.raises(StandInRace, match="reads a host buffer before the copy that writes it"):
        copy_on(backend, back, backend.empty(torch.Size([4]), torch.float32, CPU), host)


def test_a_host_buffer_is_rewritten_only_after_the_copies_that_read_it() -> None:
    backend = DeferredCopyBackend()
    out, back = backend.new_stream(CPU), backend.new_stream(CPU)
    host, source, restored = host_floats(backend), torch.arange(4.0), torch.zeros(4)
    backend.wait_event(back, copy_on(backend, out, host, source))
    copy_on(backend, back, restored, host)  # queued, not run: it may still be reading
    with pytest.raises(StandInRace, match="writes a host buffer that an earlier copy may still"):
        copy_on(backend, out, host, source)


def test_host_memory_is_freed_only_after_its_copies_ran() -> None:
    backend = DeferredCopyBackend()
    storage = backend.allocate_host(16)[0]
    buffer = HostBuffer(storage, 16, pinned=True)
    source = torch.arange(4.0)
    done = copy_on(backend, backend.new_stream(CPU), buffer.view(torch.Size([4]), torch.float32),
                   source)
    with pytest.raises(StandInRace, match="host memory freed while a copy"):
        backend.free_host(buffer)
    backend.synchronize_event(done)
    backend.free_host(buffer)


def test_a_copy_must_not_write_a_device_tensor_nothing_references() -> None:
    backend = DeferredCopyBackend()
    host = host_floats(backend)
    backend.copy(host, torch.arange(4.0))
    restored = backend.empty(torch.Size([4]), torch.float32, CPU)
    done = copy_on(backend, backend.new_stream(CPU), restored, host)
    del restored  # its memory could be another tensor's by the time the copy runs
    with pytest.raises(StandInRace, match="after its last reference was dropped"):
        backend.wait_event(backend.compute, done)
