"""`DeferredCopyBackend`: CPU memory standing in for a GPU's, with copies that run late and a
check of the order of every copy.

CPU tensors play the device's tensors, separate CPU buffers play host memory. The compute stream
is the host itself: its work (PyTorch's CPU ops) runs at once. Work queued on a side stream runs
only when a stream or the host waits for an event recorded after it (or at `synchronize`), as
late as a GPU may run it. A missing wait shows up in one of two ways:

* Order. Each stream knows, through the events it waited for, how much of every other stream's
  work comes before its next item (a vector clock). When a side-stream copy is queued it must
  come after all the work it conflicts with: a copy that reads or writes device memory after
  all the compute work queued before it (the stand-in cannot see which compute op wrote the
  source or still uses the destination, so any might: that is what a GPU allows); a copy into
  a host buffer after the copies that last read or wrote it; a copy out of a host buffer after
  the copy that last wrote it. The host frees a host buffer only after every copy that used it
  ran, and a copy writes a device tensor only while it is still referenced. Otherwise
  `StandInRace` is raised, naming the streams and the wait that is missing.
* Values. Device memory handed out uninitialised is NaN, host memory starts as NaN bytes, and a
  copy whose device source was released before the copy ran (its last reference dropped
  before the compute stream waited for the copy) writes NaN, as a copy reading reused GPU
  memory would write garbage: a compute stream that reads a restored tensor without waiting
  for its copy, or lets go of a tensor being copied, computes with NaN.

With it, the offload's pack/unpack state machine runs in CI, on real models, without a GPU.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from graft_offload.pool import HostBuffer

NAN_BYTE = 0xFF  # every float format reads bytes of all ones as NaN


class StandInRace(RuntimeError):
    """Work the stand-in was asked to queue (or a free) is not ordered after work it conflicts
    with: on a GPU it could run at the same time and read or write the wrong data."""


@dataclass(eq=False)
class StandInStream:
    """A queue of work; ``done`` counts the items that already ran. ``seen`` is the stream's
    vector clock: for each other stream, how many of its items come before this stream's next
    item (through the events this stream waited for)."""

    name: str
    work: list[Callable[[], None]] = field(default_factory=list)
    done: int = 0
    seen: dict[StandInStream, int] = field(default_factory=dict)

    @property
    def position(self) -> int:
        """How many items were queued so far."""
        return len(self.work)

    def run_until(self, position: int) -> None:
        """Run the queued work up to (not including) item ``position``."""
        while self.done < position:
            item = self.work[self.done]
            self.done += 1
            item()

    def after(self, stream: StandInStream, position: int) -> bool:
        """Whether item ``position - 1`` of ``stream`` comes before this stream's next item."""
        return stream is self or self.seen.get(stream, 0) >= position


@dataclass(eq=False)
class StandInEvent:
    """The point ``position`` in ``stream``'s queue, and what that point comes after."""

    stream: StandInStream
    position: int
    clock: dict[StandInStream, int]


@dataclass(eq=False)
class HostAccesses:
    """The copies that touched one host buffer since it was last written: ``(stream, item)``."""

    write: tuple[StandInStream, int] | None = None
    reads: list[tuple[StandInStream, int]] = field(default_factory=list)

    def all(self) -> list[tuple[StandInStream, int]]:
        return [*([self.write] if self.write else []), *self.reads]


class DeferredCopyBackend:
    """A `graft_offload.backend.CopyBackend` on CPU memory whose side-stream copies run late and
    are checked for order (`StandInRace`).

    ``pin_fails=True`` makes every host allocation report a pinning failure (pageable fallback).
    """

    device_type = "cpu"

    def __init__(self, *, pin_fails: bool = False) -> None:
        # The compute stream's work runs at once; its items only mark points in its order.
        self.compute = StandInStream("compute")
        self.pin_fails = pin_fails
        self.host_allocations = 0
        self._current: list[StandInStream] = [self.compute]
        self._streams: list[StandInStream] = []
        self._host: dict[int, HostAccesses] = {}  # host buffer storage pointer -> its copies

    def is_device_tensor(self, tensor: torch.Tensor) -> bool:
        return tensor.device.type == "cpu" and not self._is_host(tensor)

    def current_stream(self, device: torch.device) -> StandInStream:
        return self._current[-1]

    def new_stream(self, device: torch.device) -> StandInStream:
        stream = StandInStream(f"side stream {len(self._streams)}")
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
        if stream is self.compute:
            self._tick()  # the event marks all compute work queued until now
        return StandInEvent(stream, stream.position, {**stream.seen, stream: stream.position})

    def wait_event(self, stream: StandInStream, event: StandInEvent) -> None:
        for other, position in event.clock.items():
            if other is not stream:
                stream.seen[other] = max(stream.seen.get(other, 0), position)
        # Running the awaited work now is one order a GPU could choose; any later work on
        # ``stream`` then sees its results.
        self._run_through(event)
        if stream is self.compute:
            self._tick()

    @torch.no_grad()
    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        stream = self._current[-1]
        if stream is self.compute:
            self._check_host_access(stream, dst, src)
            self._tick()
            dst.copy_(src)
            return
        self._check_device_access(stream, dst, src)
        self._check_host_access(stream, dst, src)
        stream.work.append(self._deferred_copy(stream, dst, src))

    def empty(self, shape: torch.Size, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        self._tick()  # memory handed out for the compute stream: earlier compute work may use it
        return torch.full(shape, float("nan"), dtype=dtype)

    def synchronize(self) -> None:
        """Run all queued work (the host waits for the whole device)."""
        for stream in self._streams:
            stream.run_until(stream.position)

    def synchronize_event(self, event: StandInEvent) -> None:
        self._run_through(event)

    def elapsed_ms(self, start: StandInEvent, end: StandInEvent) -> float:
        self._run_through(end)
        return 0.0

    def host_capacity(self, nbytes: int) -> int:
        return max(nbytes, 1)

    def allocate_host(self, nbytes: int) -> tuple[torch.Tensor, str | None]:
        storage = torch.full((nbytes,), NAN_BYTE, dtype=torch.uint8)
        self._host[storage.untyped_storage().data_ptr()] = HostAccesses()
        self.host_allocations += 1
        return storage, "pinning disabled by the stand-in (pin_fails=True)" if self.pin_fails else None

    def free_host(self, buffer: HostBuffer) -> None:
        key = buffer.storage.untyped_storage().data_ptr()
        for stream, item in self._host[key].all():
            if stream.done <= item:
                raise StandInRace(
                    f"host memory freed while a copy on the {stream.name} still uses it: the "
                    f"host must wait for the buffer's last copy (synchronize its event) first")
        del self._host[key]

    def _is_host(self, tensor: torch.Tensor) -> bool:
        return tensor.untyped_storage().data_ptr() in self._host

    def _tick(self) -> None:
        self.compute.work.append(_nothing)
        self.compute.done = self.compute.position

    def _run_through(self, event: StandInEvent) -> None:
        for stream, position in event.clock.items():
            stream.run_until(position)

    def _check_device_access(self, stream: StandInStream, dst: torch.Tensor,
                             src: torch.Tensor) -> None:
        if (self.is_device_tensor(dst) or self.is_device_tensor(src)) \
                and not stream.after(self.compute, self.compute.position):
            what = "reads" if self.is_device_tensor(src) else "writes"
            raise StandInRace(
                f"a copy on the {stream.name} {what} device memory without waiting for the compute "
                f"work queued before it: on a GPU it may run before that work "
                f"{'produced its source' if what == 'reads' else 'is done with the memory'}; "
                f"record an event on the compute stream and make the {stream.name} wait for it")

    def _check_host_access(self, stream: StandInStream, dst: torch.Tensor,
                           src: torch.Tensor) -> None:
        item = stream.position
        if self._is_host(src):
            accesses = self._host[src.untyped_storage().data_ptr()]
            self._require(stream, [accesses.write] if accesses.write else [],
                          "reads a host buffer before the copy that writes it")
            accesses.reads.append((stream, item))
        if self._is_host(dst):
            accesses = self._host[dst.untyped_storage().data_ptr()]
            self._require(stream, accesses.all(),
                          "writes a host buffer that an earlier copy may still read or write")
            accesses.write, accesses.reads = (stream, item), []

    def _require(self, stream: StandInStream, earlier: list[tuple[StandInStream, int]],
                 what: str) -> None:
        for other, item in earlier:
            if not stream.after(other, item + 1):
                raise StandInRace(f"a copy on the {stream.name} {what} (on the {other.name}); "
                                  f"make the {stream.name} wait for that copy's event first")

    def _deferred_copy(self, stream: StandInStream, dst: torch.Tensor,
                       src: torch.Tensor) -> Callable[[], None]:
        # Device memory may be reused once its last reference is gone: hold device tensors
        # weakly, as the GPU's copy engine does not keep them alive.
        source = weakref.ref(src) if self.is_device_tensor(src) else _strong(src)
        target = weakref.ref(dst) if self.is_device_tensor(dst) else _strong(dst)

        @torch.no_grad()
        def run() -> None:
            into = target()
            if into is None:
                raise StandInRace(f"a copy on the {stream.name} wrote a device tensor after its "
                                  f"last reference was dropped: on a GPU the memory may belong "
                                  f"to another tensor by then; wait for the copy first")
            alive = source()
            if alive is None:
                into.view(torch.uint8).fill_(NAN_BYTE)
            else:
                into.copy_(alive)

        return run


def _nothing() -> None:
    return None


def _strong(tensor: torch.Tensor) -> Callable[[], torch.Tensor]:
    return lambda: tensor
