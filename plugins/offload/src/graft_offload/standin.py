"""`DeferredCopyBackend`: CPU memory standing in for a GPU's, with copies that run late.

CPU tensors play the device's tensors, separate CPU buffers play host memory. Work queued on a
side stream runs only when some stream waits for an event recorded after it (or at
`synchronize`), as late as a real GPU may run it, so a missing wait shows up in the numbers:
device memory handed out uninitialised is NaN, host memory starts as NaN bytes, and a copy
whose source tensor was already released (its last reference dropped before the compute stream
waited for the copy) writes NaN, as a copy reading reused GPU memory would write garbage. The
compute stream runs its own work at once. With it, the offload's pack/unpack state machine runs
in CI, on real models, without a GPU.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from graft_offload.pool import HostBuffer

NAN_BYTE = 0xFF  # every float format reads bytes of all ones as NaN


@dataclass(eq=False)
class StandInStream:
    """A queue of deferred work; ``done`` counts the items that already ran."""

    name: str
    work: list[Callable[[], None]] = field(default_factory=list)
    done: int = 0

    def run_until(self, position: int) -> None:
        """Run the queued work up to (not including) item ``position``."""
        while self.done < position:
            item = self.work[self.done]
            self.done += 1
            item()


@dataclass(eq=False)
class StandInEvent:
    """The point ``position`` in ``stream``'s queue (compute-stream events are always done)."""

    stream: StandInStream
    position: int


class DeferredCopyBackend:
    """A `graft_offload.backend.CopyBackend` on CPU memory whose side-stream copies run late.

    ``pin_fails=True`` makes every host allocation report a pinning failure (pageable fallback).
    """

    device_type = "cpu"

    def __init__(self, *, pin_fails: bool = False) -> None:
        self.compute = StandInStream("compute")
        self.pin_fails = pin_fails
        self.host_allocations = 0
        self._current: list[StandInStream] = [self.compute]
        self._streams: list[StandInStream] = []
        self._host_pointers: set[int] = set()

    def is_device_tensor(self, tensor: torch.Tensor) -> bool:
        return tensor.device.type == "cpu" and not self._is_host(tensor)

    def current_stream(self, device: torch.device) -> StandInStream:
        return self._current[-1]

    def new_stream(self, device: torch.device) -> StandInStream:
        stream = StandInStream(f"side{len(self._streams)}")
        self._streams.append(stream)
        return stream

    @contextmanager
    def stream_context(self, stream: StandInStream) -> Iterator[StandInStream]:
        self._current.append(stream)
        try:
            yield stream
        finally:
            self._current.pop()

    def record_event(self, stream: StandInStream, *, timing: bool = False) -> StandInEvent:
        return StandInEvent(stream, len(stream.work))

    def wait_event(self, stream: StandInStream, event: StandInEvent) -> None:
        # Running the awaited work now is one order a GPU could choose; any later work on
        # ``stream`` then sees its results.
        if event.stream is not stream:
            event.stream.run_until(event.position)

    @torch.no_grad()
    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        stream = self._current[-1]
        if stream is self.compute:
            dst.copy_(src)
            return
        if self.is_device_tensor(src):
            source = weakref.ref(src)  # device memory may be reused once released

            @torch.no_grad()
            def read_device() -> None:
                alive = source()
                if alive is None:
                    dst.view(torch.uint8).fill_(NAN_BYTE)
                else:
                    dst.copy_(alive)

            stream.work.append(read_device)
        else:
            stream.work.append(torch.no_grad()(lambda: dst.copy_(src)))

    def empty(self, shape: torch.Size, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.full(shape, float("nan"), dtype=dtype)

    def synchronize(self) -> None:
        """Run all queued work (the host waits for the whole device)."""
        for stream in self._streams:
            stream.run_until(len(stream.work))

    def elapsed_ms(self, start: StandInEvent, end: StandInEvent) -> float:
        end.stream.run_until(end.position)
        return 0.0

    def host_capacity(self, nbytes: int) -> int:
        return max(nbytes, 1)

    def allocate_host(self, nbytes: int) -> tuple[torch.Tensor, str | None]:
        storage = torch.full((nbytes,), NAN_BYTE, dtype=torch.uint8)
        self._host_pointers.add(storage.untyped_storage().data_ptr())
        self.host_allocations += 1
        return storage, "pinning disabled by the stand-in (pin_fails=True)" if self.pin_fails else None

    def free_host(self, buffer: HostBuffer) -> None:
        if buffer.free_after is not None:
            buffer.free_after.stream.run_until(buffer.free_after.position)
        self._host_pointers.discard(buffer.storage.untyped_storage().data_ptr())

    def _is_host(self, tensor: torch.Tensor) -> bool:
        return tensor.untyped_storage().data_ptr() in self._host_pointers
