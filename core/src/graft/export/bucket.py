"""`Bucket`: one reusable flat buffer that export packs tensors into, handed to a sink when full."""

from __future__ import annotations

import torch

from graft.export.sinks.base import RowBlock

ALIGN = 64  # bytes; keeps every view aligned for any dtype
# Tensors from this size on are copied one by one: a plain copy is a cudaMemcpy at full device
# bandwidth, while the multi-tensor copy kernel reaches less of it on large tensors (see
# bench/README.md). Below it, one kernel for all saves the launches.
SEPARATE_COPY_BYTES = 1 << 20


def aligned(offset: int) -> int:
    """``offset`` rounded up to the next multiple of `ALIGN` bytes."""
    return -(-offset // ALIGN) * ALIGN


def copy_tensors(targets: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
    """``targets[i].copy_(sources[i])`` for all i, asynchronously, at the best bandwidth:
    small tensors in one multi-tensor copy, large ones as separate copies."""
    small_targets, small_sources = [], []
    for target, source in zip(targets, sources, strict=True):
        if source.numel() * source.element_size() >= SEPARATE_COPY_BYTES:
            target.copy_(source, non_blocking=True)
        else:
            small_targets.append(target)
            small_sources.append(source)
    if small_targets:
        torch._foreach_copy_(small_targets, small_sources, non_blocking=True)


class Bucket:
    """A byte buffer of fixed capacity holding named tensors (or row blocks of them) back to
    back."""

    def __init__(self, capacity_bytes: int, device: torch.device, *, pin: bool = False) -> None:
        self.capacity = capacity_bytes
        self.buffer = torch.empty(capacity_bytes, dtype=torch.uint8, device=device,
                                  pin_memory=pin and device.type == "cpu"
                                  and torch.cuda.is_available())
        # name, dtype, shape, start, and for a row block (row offset, whole tensor's shape)
        self.entries: list[tuple[str, torch.dtype, torch.Size, int,
                                 tuple[int, tuple[int, ...]] | None]] = []
        self.used = 0
        self._pending: tuple[list[torch.Tensor], list[torch.Tensor]] = ([], [])

    def add(self, name: str, tensor: torch.Tensor, *, defer: bool = False,
            rows: tuple[int, tuple[int, ...]] | None = None) -> bool:
        """Copy ``tensor`` in; False (nothing copied) when it does not fit.

        ``defer=True`` batches the copy with the other deferred ones (one multi-tensor copy at
        `materialize`); only for tensors that stay alive and unchanged until then (views of
        parameters), never for temporaries. ``rows`` = ``(row offset, whole shape)`` marks
        ``tensor`` as a row block of the tensor ``name`` (`row_blocks` returns it as a
        `RowBlock`).
        """
        nbytes = tensor.numel() * tensor.element_size()
        start = aligned(self.used)
        if start + nbytes > self.capacity:
            return False
        target = self.buffer[start:start + nbytes].view(tensor.dtype).view(tensor.shape)
        if defer:
            self._pending[0].append(target)
            self._pending[1].append(tensor)
        else:
            target.copy_(tensor, non_blocking=True)
        self.entries.append((name, tensor.dtype, tensor.shape, start, rows))
        self.used = start + nbytes
        return True

    def materialize(self) -> None:
        """Run the deferred copies."""
        targets, sources = self._pending
        if targets:
            copy_tensors(targets, sources)
        self._pending = ([], [])

    def views(self) -> list[tuple[str, torch.Tensor]]:
        """The packed whole tensors as views of the buffer (valid until the next `clear`)."""
        self.materialize()
        return [(name, self._view(dtype, shape, start))
                for name, dtype, shape, start, rows in self.entries if rows is None]

    def row_blocks(self) -> list[RowBlock]:
        """The packed row blocks, their values views of the buffer (valid until `clear`)."""
        return [RowBlock(name, self._view(dtype, shape, start), rows[0], rows[1])
                for name, dtype, shape, start, rows in self.entries if rows is not None]

    def _view(self, dtype: torch.dtype, shape: torch.Size, start: int) -> torch.Tensor:
        nbytes = shape.numel() * dtype.itemsize
        return self.buffer[start:start + nbytes].view(dtype).view(shape)

    def wait(self) -> None:
        """Block until queued device-to-host copies into a host buffer are done (a sink reads it
        from the CPU); device buffers need no wait, sinks work on the same stream."""
        if self.buffer.device.type == "cpu" and torch.cuda.is_available():
            torch.cuda.current_stream().synchronize()

    def clear(self) -> None:
        """Forget the contents; the buffer is reused."""
        self.entries.clear()
        self.used = 0
        self._pending = ([], [])

    def __len__(self) -> int:
        return len(self.entries)
