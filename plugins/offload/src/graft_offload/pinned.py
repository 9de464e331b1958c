"""Page-locked host memory that the offload's pool owns, allocated and freed by the pool itself.

``torch.empty(..., pin_memory=True)`` takes memory from PyTorch's caching host allocator, which
rounds every block up to a power of two and keeps a freed block pinned for reuse until its
cache is emptied: the pool's ceiling (``host_cache_limit_gb``) then bounds what the pool uses,
not what the process holds pinned (a run held more pinned than the pool's ceiling, and
kept it after the pool closed: bench/README.md, offload). Here a buffer is ordinary (pageable)
memory, page-aligned, that the pool registers with CUDA (``cudaHostRegister``, as
torch.distributed.checkpoint's pinned staging does) and unregisters before it frees it, so what
is pinned is exactly what the pool holds.
"""

from __future__ import annotations

import weakref
from typing import Any, Protocol

import torch

PAGE = 4096
PORTABLE = 1  # cudaHostRegisterPortable: page-locked for every CUDA context of the process

# Registered buffers by address -> the finalizer that unregisters them: run by `free_pinned`,
# or when the buffer is collected (a pool dropped without closing), before its memory is freed.
_REGISTERED: dict[int, weakref.finalize] = {}


class HostRegistry(Protocol):
    """The CUDA runtime calls the pool needs (``torch.cuda.cudart()`` has them)."""

    def cudaHostRegister(self, ptr: int, size: int, flags: int) -> Any:  # noqa: N802
        """Page-lock ``size`` bytes at ``ptr``; returns a cudaError (0: success)."""

    def cudaHostUnregister(self, ptr: int) -> Any:  # noqa: N802
        """Undo ``cudaHostRegister`` of the range starting at ``ptr``; returns a cudaError."""

    def cudaGetErrorString(self, error: Any) -> str:  # noqa: N802
        """The message of a cudaError."""


def page_rounded(nbytes: int) -> int:
    """``nbytes`` rounded up to whole pages (at least one page)."""
    return max(PAGE, -(-nbytes // PAGE) * PAGE)


def allocate_pinned(nbytes: int, registry: HostRegistry) -> tuple[torch.Tensor, str | None]:
    """``nbytes`` (whole pages) of page-aligned host memory as a uint8 tensor, registered with
    CUDA; None, or the reason registering failed (the memory is then pageable).

    The memory is over-allocated by one page and the aligned part is used, so that no other
    allocation shares a registered page.
    """
    if nbytes % PAGE:
        raise ValueError(f"allocate_pinned takes whole pages, got {nbytes} bytes")
    base = torch.empty(nbytes + PAGE, dtype=torch.uint8)
    offset = -base.data_ptr() % PAGE
    buffer = base[offset:offset + nbytes]
    pointer = buffer.data_ptr()
    error = registry.cudaHostRegister(pointer, nbytes, PORTABLE)
    if int(error) != 0:
        return buffer, f"cudaHostRegister: {registry.cudaGetErrorString(error)}"
    _REGISTERED[pointer] = weakref.finalize(buffer, _unregister, registry, pointer)
    return buffer, None


def free_pinned(buffer: torch.Tensor, registry: HostRegistry) -> None:
    """Unregister a buffer of `allocate_pinned` (its last copy must be done); the memory goes
    back to the process's allocator when the tensor is dropped."""
    finalizer = _REGISTERED.get(buffer.data_ptr())
    if finalizer is None:
        raise ValueError("free_pinned: the buffer is not registered by allocate_pinned")
    error = finalizer()
    if int(error) != 0:
        raise RuntimeError(f"graft-offload: cudaHostUnregister failed: "
                           f"{registry.cudaGetErrorString(error)}")


def _unregister(registry: HostRegistry, pointer: int) -> Any:
    _REGISTERED.pop(pointer, None)
    return registry.cudaHostUnregister(pointer)
