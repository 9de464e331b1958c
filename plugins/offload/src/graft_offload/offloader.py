"""`Offloader`: the saved-tensor hooks around one model's selected blocks.

A selected block runs inside a ``saved_tensors_hooks`` context that is the *outer* hook around
activation checkpointing: non-reentrant checkpointing saves the block's positional inputs before
it pushes its own hook, so exactly those reach the pack hook here, while everything inside the
block goes to checkpointing's hook and is recomputed. (When the checkpoint runs inside a
compiled block, as with transformers >= 5.23 and ``engine.compile``, the compiled graph saves
the input with the parameters and RoPE tables it recomputes from; all of them reach the hook,
which offloads the input only and counts the rest in ``offload/other_saved_gb``.) The pack hook
copies the block's input (its first positional tensor) to a host buffer on a side stream; at
the next block's start the compute stream waits for that copy and the input's device memory is
let go. In backward, the unpack hook brings the input back (usually already prefetched) and
starts bringing back the inputs of the next blocks down. The last block's input is never
offloaded: its backward runs first. Passes without gradients (rollout, old and reference
log-probs) run untouched.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import torch

from graft_offload.backend import CopyBackend
from graft_offload.entry import State, SwapEntry
from graft_offload.pool import HostBufferPool
from graft_offload.stats import (
    HOST_FULL,
    KEYWORD_INPUT,
    LAST_BLOCK,
    StepStats,
    copy_rates,
    describe_kept,
    step_metrics,
)
from graft_offload.transfers import Transfers

logger = logging.getLogger("graft.offload")


class PassRecord:
    """The entries one forward pass saved, by block index (weakly: the graph owns them)."""

    def __init__(self) -> None:
        self.last_block = -1
        self._entries: dict[int, list[weakref.ref[SwapEntry]]] = {}

    def add(self, entry: SwapEntry) -> None:
        self._entries.setdefault(entry.block, []).append(weakref.ref(entry))

    def entries(self, block: int) -> list[SwapEntry]:
        """The live entries of ``block``."""
        return [e for e in (ref() for ref in self._entries.get(block, ())) if e is not None]


def ineligible_reason(tensor: torch.Tensor, backend: CopyBackend, min_bytes: int) -> str | None:
    """Why ``tensor`` must stay on the device, or None when it may be offloaded."""
    nbytes = tensor.numel() * tensor.element_size()
    if not backend.is_device_tensor(tensor):
        return "not on the device"
    if isinstance(tensor, torch.nn.Parameter):
        return "a parameter"
    if tensor._base is not None:
        return "a view of another tensor"
    if not tensor.is_contiguous():
        return "not contiguous"
    if tensor.storage_offset() != 0 or tensor.untyped_storage().nbytes() != nbytes:
        return "shares its storage with other tensors"
    if nbytes < min_bytes:
        return "smaller than min_tensor_mb"
    return None


class Offloader:
    """Offload the inputs of the blocks ``names`` (in forward order) of one model."""

    def __init__(self, names: Sequence[str], *, backend: CopyBackend, pool: HostBufferPool,
                 device: torch.device | None = None, min_bytes: int = 0,
                 prefetch_blocks: int = 1, timing: bool = False) -> None:
        if not names:
            raise ValueError("Offloader needs at least one block")
        self.names = list(names)
        self.backend = backend
        self.pool = pool
        self.transfers = Transfers(backend, device, timing=timing)
        self.min_bytes = min_bytes
        self.prefetch_blocks = prefetch_blocks
        self.stats = StepStats()
        self._copying_out: list[SwapEntry] = []
        # Device tensors of entries collected during their copy back, with its event.
        self._orphans: deque[tuple[torch.Tensor, Any]] = deque()
        self._pass: PassRecord | None = None
        self._lock = threading.RLock()
        self._warned_keywords: set[int] = set()
        self._reported_kept: dict[int, str] = {}
        # None until the first block input with gradients says whether the model is on the
        # backend's device (``device`` may be unknown when the offload is applied: a model
        # built on the meta device gets its device only when it is sharded and filled).
        self._off_device: bool | None = None

    @property
    def last_block(self) -> int:
        """The index of the last selected block, whose input always stays on the device."""
        return len(self.names) - 1

    def run_block(self, block: int, call: Callable[..., Any], args: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> Any:
        """``call(*args, **kwargs)``: block ``block``'s own ``__call__``, with its input offloaded
        when gradients are on. An exception resets the offload state and propagates."""
        if not torch.is_grad_enabled():
            return call(*args, **kwargs)
        boundary = next((a for a in args if isinstance(a, torch.Tensor)), None)
        self._report_keyword_inputs(block, kwargs, positional=boundary is not None)
        if boundary is None or not self._runs_on(boundary):
            return call(*args, **kwargs)
        reason = LAST_BLOCK if block == self.last_block else ineligible_reason(
            boundary, self.backend, self.min_bytes)
        with self._lock:
            self.release_copied()
            record = self._record_for(block)
        pack = _BlockPack(self, block, _identity(boundary), reason, record)
        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, self.unpack):
                return call(*args, **kwargs)
        except BaseException:
            self.reset()
            raise

    def save_input(self, block: int, tensor: torch.Tensor, reason: str | None,
                   record: PassRecord) -> SwapEntry:
        """The pack hook's work for a block input: start its copy to the host, or keep it on
        the device (``reason`` says why, when known before the pool is asked)."""
        with self._lock:
            entry = SwapEntry(block, tensor, record)
            record.add(entry)
            buffer = None if reason else self.pool.acquire(entry.nbytes)
            if reason is None and buffer is None:
                reason = HOST_FULL
            if reason is not None:
                self.stats.keep(block, reason, entry.nbytes)
                return entry
            entry.start_copy_out(buffer, self.transfers, self.pool, self._orphans)
            self._copying_out.append(entry)
            self.stats.offloaded_bytes += entry.nbytes
            self.stats.offloaded_inputs += 1
            return entry

    def unpack(self, packed: Any) -> torch.Tensor:
        """The unpack hook: the saved tensor back on the device; prefetch the blocks below."""
        if not isinstance(packed, SwapEntry):
            return packed
        with self._lock:
            self._count_fetch(packed)
            copying_out = packed.state is State.COPYING_OUT
            tensor = packed.restore(self.transfers, self.pool)
            if copying_out and packed in self._copying_out:
                # restored before the next block started (the last block of a pass, as in a
                # checkpoint group's replay): the tensor is autograd's now; once the compute
                # stream waited for the copy out, nothing here may hold it
                self.transfers.wait(packed.copied_out)
                self._copying_out.remove(packed)
            self._prefetch_below(packed)
            return tensor

    def release_copied(self) -> None:
        """Let go of the device memory of every input whose copy out was queued, and of every
        orphaned copy back: the compute stream waits for those copies first."""
        with self._lock:
            for entry in self._copying_out:
                entry.release_device_copy(self.transfers)
            self._copying_out.clear()
            while self._orphans:
                _, copied_in = self._orphans.popleft()
                self.transfers.wait(copied_in)

    def reset(self) -> None:
        """Forget the current pass (each step, and after an exception in a block). Entries that
        graphs still hold stay valid; their buffers return when they are restored or dropped."""
        with self._lock:
            self.release_copied()
            self._pass = None

    def begin_step(self) -> None:
        """Start a training step: reset the state and this step's counters."""
        with self._lock:
            self.reset()
            self.stats = StepStats()
            self.transfers.take_times()

    def end_step(self) -> dict[str, float]:
        """This step's metrics (``offload/host_gb``, ``offload/pinned_gb``,
        ``offload/offloaded_gb``, ``offload/offloaded_inputs``, ``offload/other_saved_gb``,
        ``offload/kept_on_gpu_blocks``, ``offload/kept_on_gpu_gb``, and the copy rates with
        ``timing``); reports the blocks whose input stayed on the GPU
        when they change."""
        with self._lock:
            self.release_copied()
            metrics = step_metrics(self.stats, self.pool.held_bytes, self.pool.pinned_bytes,
                                   self.last_block)
            if self.transfers.timing:
                metrics.update(copy_rates(self.transfers.take_times(), self.backend.elapsed_ms))
            self._report_kept()
            return metrics

    def _runs_on(self, boundary: torch.Tensor) -> bool:
        with self._lock:
            if self._off_device is None:
                self._off_device = not self.backend.is_device_tensor(boundary)
                if self._off_device:
                    logger.warning("graft-offload: the model runs on %s, not on a %s device: "
                                   "activation offload does nothing in this run",
                                   boundary.device, self.backend.device_type.upper())
            return not self._off_device

    def _record_for(self, block: int) -> PassRecord:
        # A block index that does not increase starts a new forward pass.
        if self._pass is None or block <= self._pass.last_block:
            self._pass = PassRecord()
            self.stats.passes += 1
        self._pass.last_block = block
        return self._pass

    def _count_fetch(self, entry: SwapEntry) -> None:
        if entry.state is State.ON_HOST:
            self.stats.fetched_bytes += entry.nbytes

    def _prefetch_below(self, entry: SwapEntry) -> None:
        lowest = max(entry.block - self.prefetch_blocks, 0)
        for block in range(entry.block - 1, lowest - 1, -1):
            for other in entry.record.entries(block):
                self._count_fetch(other)
                other.start_copy_in(self.transfers)

    def _report_keyword_inputs(self, block: int, kwargs: dict[str, Any], *, positional: bool) -> None:
        captured = [name for name, value in kwargs.items()
                    if isinstance(value, torch.Tensor) and value.requires_grad]
        if not captured:
            return
        if not positional:
            self.stats.keep(block, KEYWORD_INPUT)
        if block not in self._warned_keywords:
            self._warned_keywords.add(block)
            logger.warning(
                "graft-offload: %s received %s as keyword argument(s); transformers' checkpoint "
                "wrapper keeps keyword arguments in a closure, out of reach of saved-tensor "
                "hooks, so %s stays on the GPU. Pass the block input positionally, as "
                "transformers' own decoder loops do.", self.names[block],
                ", ".join(repr(n) for n in captured), "it" if len(captured) == 1 else "they")

    def _report_kept(self) -> None:
        kept = self.stats.kept_blocks(self.last_block)
        if kept and kept != self._reported_kept:
            logger.warning("graft-offload: block inputs kept on the GPU this step: %s (%.2f GiB "
                           "of host memory held)", describe_kept(kept, self.names),
                           self.pool.held_bytes / 2**30)
        self._reported_kept = kept


class _BlockPack:
    """The pack hook of one block call: offloads the tensor that is the block's input (saved
    once however many times the block saves it), passes every other tensor through.

    Autograd keeps a pack hook as long as the tensor it saved, so this holds the input's
    identity, never the input itself (that would pin its device memory).
    """

    def __init__(self, offloader: Offloader, block: int, identity: tuple[Any, ...],
                 reason: str | None, record: PassRecord) -> None:
        self.offloader = offloader
        self.block = block
        self.identity = identity
        self.reason = reason
        self.record = record
        self.entry: SwapEntry | None = None

    def __call__(self, tensor: torch.Tensor) -> Any:
        if _identity(tensor) != self.identity:
            # Transformers >= 5.23 checkpoints inside the block's forward, so with compiled
            # blocks the checkpoint is part of the compiled graph, which saves the input with
            # the parameters and RoPE tables it recomputes from; they stay where they are.
            if not isinstance(tensor, torch.nn.Parameter):
                self.offloader.stats.note_other_saved(tensor)
            return tensor
        if self.entry is None:
            self.entry = self.offloader.save_input(self.block, tensor, self.reason, self.record)
        return self.entry


def _identity(tensor: torch.Tensor) -> tuple[Any, ...]:
    return tensor.data_ptr(), tensor.shape, tensor.dtype, tensor.device
