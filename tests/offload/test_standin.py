"""The CPU stand-in for the device: side-stream copies run only once awaited, like a GPU's may."""

from __future__ import annotations

import torch

from graft_offload.standin import DeferredCopyBackend

CPU = torch.device("cpu")


def test_a_side_stream_copy_runs_when_the_compute_stream_waits_for_it() -> None:
    backend = DeferredCopyBackend()
    side = backend.new_stream(CPU)
    source, host = torch.arange(4.0), backend.allocate_host(16)[0].view(torch.float32)
    with backend.stream_context(side):
        assert backend.current_stream(CPU) is side
        backend.copy(host, source)
        done = backend.record_event(side)
    assert backend.current_stream(CPU) is backend.compute
    assert host.isnan().all()  # host memory starts as NaN bytes; the copy has not run
    backend.wait_event(backend.compute, done)
    assert torch.equal(host, source)


def test_a_copy_whose_source_was_released_reads_garbage() -> None:
    backend = DeferredCopyBackend()
    side = backend.new_stream(CPU)
    host = backend.allocate_host(16)[0].view(torch.float32)
    with backend.stream_context(side):
        backend.copy(host, torch.arange(4.0))  # nothing else holds the source
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
