"""Copy backends: the device operations the offload runs on (streams, events, copies, host memory).

`CopyBackend` is what the offload needs; `CudaCopyBackend` implements it with CUDA streams and
events and pinned host memory. Tests put `graft_offload.standin.DeferredCopyBackend` in its
place, so the same state machine runs on a CPU (`graft_offload.runtime.use_copy_backend`).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol

import torch

from graft_offload.pinned import HostRegistry, allocate_pinned, free_pinned, page_rounded
from graft_offload.pool import HostBuffer


class CopyBackend(Protocol):
    """Device operations, all asynchronous with respect to the host where the device allows."""

    device_type: str  # the device type whose tensors this backend offloads ("cuda")

    def is_device_tensor(self, tensor: torch.Tensor) -> bool:
        """True when ``tensor`` lives on the device (only such tensors are offloaded)."""

    def current_stream(self, device: torch.device) -> Any:
        """The stream work is being queued on now; looked up on every call, never cached."""

    def new_stream(self, device: torch.device) -> Any:
        """A new side stream on ``device``."""

    def stream_context(self, stream: Any) -> AbstractContextManager[Any]:
        """Make ``stream`` the current stream inside the block."""

    def record_event(self, stream: Any, *, timing: bool = False) -> Any:
        """An event marking the work queued on ``stream`` so far (with a timestamp if ``timing``)."""

    def wait_event(self, stream: Any, event: Any) -> None:
        """Make later work on ``stream`` wait for ``event`` (without blocking the host)."""

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Queue ``dst.copy_(src)`` on the current stream, asynchronously."""

    def empty(self, shape: torch.Size, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """Uninitialised device memory, allocated for the current stream."""

    def elapsed_ms(self, start: Any, end: Any) -> float:
        """Milliseconds between two timing events (waits for ``end``)."""

    def synchronize_event(self, event: Any) -> None:
        """Block the host until the work before ``event`` is done."""

    def host_capacity(self, nbytes: int) -> int:
        """The bytes a host allocation of ``nbytes`` really takes."""

    def allocate_host(self, nbytes: int) -> tuple[torch.Tensor, str | None]:
        """``nbytes`` (a `host_capacity`) of host memory; None when pinned, else the reason
        pinning failed."""

    def free_host(self, buffer: HostBuffer) -> None:
        """Give ``buffer`` back (the caller made sure its last copy is done)."""


class CudaCopyBackend:
    """CUDA streams and events; host memory the pool owns, page-locked with ``cudaHostRegister``
    (`graft_offload.pinned`), never PyTorch's caching host allocator, whose freed blocks stay
    pinned: the pool's ceiling bounds what the process really holds pinned.

    ``registry`` is the CUDA runtime's registration calls (``torch.cuda.cudart()`` unless given).
    """

    device_type = "cuda"

    def __init__(self, registry: HostRegistry | None = None) -> None:
        self._registry = registry

    def is_device_tensor(self, tensor: torch.Tensor) -> bool:
        return tensor.is_cuda

    def current_stream(self, device: torch.device) -> torch.cuda.Stream:
        return torch.cuda.current_stream(device)

    def new_stream(self, device: torch.device) -> torch.cuda.Stream:
        return torch.cuda.Stream(device=device)

    def stream_context(self, stream: torch.cuda.Stream) -> AbstractContextManager[Any]:
        return torch.cuda.stream(stream)

    def record_event(self, stream: torch.cuda.Stream, *, timing: bool = False) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=timing)
        event.record(stream)
        return event

    def wait_event(self, stream: torch.cuda.Stream, event: torch.cuda.Event) -> None:
        stream.wait_event(event)

    @torch.no_grad()
    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src, non_blocking=True)

    def empty(self, shape: torch.Size, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, device=device)

    def elapsed_ms(self, start: torch.cuda.Event, end: torch.cuda.Event) -> float:
        end.synchronize()
        return start.elapsed_time(end)

    def synchronize_event(self, event: torch.cuda.Event) -> None:
        event.synchronize()

    def host_capacity(self, nbytes: int) -> int:
        return page_rounded(nbytes)

    def allocate_host(self, nbytes: int) -> tuple[torch.Tensor, str | None]:
        return allocate_pinned(nbytes, self.registry)

    def free_host(self, buffer: HostBuffer) -> None:
        if buffer.pinned:
            free_pinned(buffer.storage, self.registry)

    @property
    def registry(self) -> HostRegistry:
        """The CUDA runtime's host-registration calls."""
        if self._registry is None:
            self._registry = torch.cuda.cudart()
        return self._registry
