"""Streamed weight export: one parameter at a time, through a reused bucket, into a sink.

Every rank walks the same parameters in the same order and takes part in gathering each one from
its FSDP2 shards; the exporting rank (rank 0) converts it to the layout its sink's consumer loads
(``graft_export_slots``; ``sink.consumer``: a HF checkpoint or an inference engine), packs the result into a
bucket of ``export.bucket_mb`` and hands full buckets to the sink. The full state dict is never
built: extra memory stays within one bucket plus the largest parameter, and for expert-parallel
experts within one bucket plus one block of experts (`graft.export.expert_blocks`): per-expert HF
tensors, or row blocks of a fused HF tensor (`RowBlock`) that the sink assembles.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from graft.export.bucket import Bucket
from graft.export.context import CONSUMERS, HF_LAYOUT, ExportContext
from graft.export.copy_plan import CopyPlan, fill_bucket, plan_copies
from graft.export.expert_blocks import ReceiveBuffers, stream_expert_blocks
from graft.export.gather import expert_mesh_dim, gather_full
from graft.export.handlers import (
    block_hf_name,
    entry_tensor,
    export_slots,
    exported_entries,
    meta_skeleton,
    passes_through,
)
from graft.export.sinks.base import ExportFilter, RowAssembler, RowBlock, UpdateSink, WeightSink

# What `_entries` yields: a whole tensor ``(hf_name, tensor, is_view)`` or a row block.
Entry = tuple[str, torch.Tensor, bool] | RowBlock

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str, model: torch.nn.Module) -> torch.dtype | None:
    """``export.dtype``: ``auto`` is the model config's dtype, else the trained dtype (None)."""
    if name != "auto":
        return DTYPES[name]
    configured = getattr(model.config, "dtype", None)
    if isinstance(configured, str):
        configured = DTYPES.get(configured)
    return configured if isinstance(configured, torch.dtype) else None


def default_bucket_bytes(bucket_mb: int | None, device: torch.device) -> int:
    """``export.bucket_mb`` in bytes; null means 2048 MiB on GPU and 64 MiB on CPU."""
    return (bucket_mb or (2048 if device.type == "cuda" else 64)) << 20


@dataclass
class ExportStats:
    """What one export moved."""

    tensors: int = 0
    bytes_sent: int = 0
    bytes_total: int = 0
    buckets: int = 0
    seconds: float = 0.0
    # The exporter's filter said this export may send less than every tensor (`ExportFilter`).
    partial: bool = False

    @property
    def gb_per_s(self) -> float:
        """Full-model bytes per second (GB/s)."""
        return self.bytes_total / max(self.seconds, 1e-9) / 1e9


def _entries(model: torch.nn.Module, dtype: torch.dtype | None, is_main: bool,
             consumer: str = HF_LAYOUT) -> Iterator[Entry]:
    ctx = ExportContext(model, model.config.model_type, meta_skeleton(model), dtype,
                        consumer=consumer)
    buffers = ReceiveBuffers()
    for name, entry in exported_entries(model):
        value = entry_tensor(entry)
        if expert_mesh_dim(value) is not None:
            yield from _expert_block_entries(name, value, ctx, buffers, is_main)
            continue
        full, is_view = gather_full(value, dtype=dtype)
        if not is_main:
            continue
        if passes_through(name, tuple(full.shape), full.dtype, ctx):
            yield name, full, is_view
        else:
            for hf_name, tensor in export_slots(name, full, ctx):
                yield hf_name, tensor, is_view


def _expert_block_entries(name: str, value: torch.Tensor, ctx: ExportContext,
                          buffers: ReceiveBuffers, is_main: bool) -> Iterator[Entry]:
    """An expert-parallel parameter, one ``ep`` block at a time: the handlers' tensors for the
    block (per-expert names, global ids), or the block as rows of the HF tensor when they pass
    it through (a fused layout). Every rank runs it; only the exporting rank yields."""
    for block, offset in stream_expert_blocks(value, dtype=_cast(value, ctx.dtype),
                                              buffers=buffers, is_main=is_main):
        block_ctx = dataclasses.replace(ctx, expert_offset=offset)
        hf_name = block_hf_name(name, tuple(block.shape), block.dtype, block_ctx)
        if hf_name is not None:
            yield RowBlock(hf_name, block, offset, (value.shape[0], *block.shape[1:]))
        else:
            for slot_name, tensor in export_slots(name, block, block_ctx):
                yield slot_name, tensor, False


def _cast(value: torch.Tensor, dtype: torch.dtype | None) -> torch.dtype | None:
    """The dtype a tensor is exported in: ``dtype`` for floating-point tensors, else its own."""
    return dtype if dtype is not None and value.is_floating_point() else None


def _whole(entries: Iterator[Entry],
           assembler: RowAssembler) -> Iterator[tuple[str, torch.Tensor, bool]]:
    """``entries`` with row blocks assembled into whole tensors by ``assembler``, for
    consumers that take only whole tensors."""
    for entry in entries:
        if not isinstance(entry, RowBlock):
            yield entry
            continue
        whole = assembler.add(entry)
        if whole is not None:
            yield entry.name, whole, False


def hf_tensors(model: torch.nn.Module, *, dtype: torch.dtype | None, is_main: bool = True,
               consumer: str = HF_LAYOUT) -> Iterator[tuple[str, torch.Tensor]]:
    """Every exported tensor as ``(hf_name, tensor)``, gathered one parameter at a time, in the
    layout ``consumer`` loads.

    The Python iterator for library users. Under several ranks every rank must exhaust it (it
    gathers collectively); only ``is_main`` ranks get tensors. Tensors may be views of the
    model's parameters: copy what you keep across training steps. Expert-parallel fused tensors
    are assembled whole here (one whole tensor of memory).
    """
    for hf_name, tensor, _ in _whole(_entries(model, dtype, is_main, consumer),
                                     RowAssembler(device=None)):
        yield hf_name, tensor


def _agree_on_consumer(consumer: str, device: torch.device, group: Any = None) -> str:
    """The ``consumer`` of rank 0 of ``group`` (default: all ranks) on every rank of it (one
    small broadcast from ``device``, the model's; none on a single rank)."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return consumer
    index = torch.tensor([CONSUMERS.index(consumer)], device=device)
    dist.broadcast(index, src=0 if group is None else dist.get_global_rank(group, 0),
                   group=group)
    return CONSUMERS[int(index.item())]


def sink_consumer(sink: WeightSink | None) -> str:
    """Who loads what ``sink`` receives (its ``consumer`` attribute; ``hf`` without one)."""
    consumer = getattr(sink, "consumer", HF_LAYOUT)
    if consumer not in CONSUMERS:
        raise ValueError(f"{type(sink).__name__}.consumer={consumer!r}: export knows the "
                         f"consumers {', '.join(CONSUMERS)}")
    return consumer


class WeightExporter:
    """Exports a model to sinks again and again (``bucket_bytes`` per bucket, in ``dtype`` or
    the trained dtype; call `export` on every rank, the sink on the exporting one).

    An export whose handlers pass every parameter through, or slice it into views tiling it,
    for the sink's consumer follows a bucket layout computed once per consumer
    (`graft.export.copy_plan`); any other export streams parameter by parameter, in the layout
    of the sink's consumer (``sink.consumer``). ``entry_filter`` (an `ExportFilter`, the same
    kind on every rank; graft-vllm's delta export) sees every streamed entry before it is
    bucketed and may drop, replace or turn it into a sink update; with one, every export
    streams. ``group``: the ranks that export together (the model's; default: all).
    """

    def __init__(self, model: torch.nn.Module, *, bucket_bytes: int, dtype: torch.dtype | None,
                 is_main: bool, bucket_device: torch.device | None = None,
                 entry_filter: ExportFilter | None = None, group: Any = None) -> None:
        self.model = model
        self.group = group
        self.dtype = dtype
        self.is_main = is_main
        self.entry_filter = entry_filter
        device = bucket_device or next(model.parameters()).device
        self.bucket = Bucket(bucket_bytes, device, pin=True) if is_main else None
        self.bucket_bytes = bucket_bytes
        self._plans: dict[str, CopyPlan | None] = {}
        # The plan of an export to a Hugging Face checkpoint (None: streamed).
        self.copy_plan: CopyPlan | None = None if entry_filter is not None else self._plan(HF_LAYOUT)

    def _plan(self, consumer: str) -> CopyPlan | None:
        if consumer not in self._plans:
            self._plans[consumer] = plan_copies(self.model, bucket=self.bucket,
                                                bucket_bytes=self.bucket_bytes, dtype=self.dtype,
                                                consumer=consumer)
        return self._plans[consumer]

    def _plan_for(self, consumer: str) -> tuple[CopyPlan | None, str]:
        """The copy plan of a full export to ``consumer`` (the exporting rank's sink's) and that
        consumer, the same on every rank: plans are computed alike everywhere, and only when
        they disagree on planned or streamed does rank 0 tell the others its consumer."""
        plans = {name: self._plan(name) for name in CONSUMERS}
        if len({plan is None for plan in plans.values()}) > 1:
            consumer = _agree_on_consumer(consumer, next(self.model.parameters()).device,
                                          self.group)
        return plans[consumer], consumer

    def export(self, sink: WeightSink | None) -> ExportStats:
        """One export into ``sink`` (None on ranks that only help gather)."""
        stats = ExportStats()
        started = time.perf_counter()
        plan, consumer = None, sink_consumer(sink)
        if self.entry_filter is None:
            plan, consumer = self._plan_for(consumer)
        else:
            stats.partial = bool(self.entry_filter.begin())
        if sink is not None:
            sink.begin()
        try:
            if plan is not None:
                self._send_planned(plan, sink, stats)
            else:
                self._send_streamed(sink, consumer, stats)
            if sink is not None:
                sink.finish()
        except BaseException as error:
            if self.bucket is not None:
                self.bucket.clear()
            if sink is not None:
                sink.abort(error)
            raise
        stats.seconds = time.perf_counter() - started
        return stats

    def _send_planned(self, plan: CopyPlan, sink: WeightSink | None, stats: ExportStats) -> None:
        for planned in plan.buckets:
            fill_bucket(planned)  # on every rank: a collective when the model is sharded
            if self.bucket is not None:  # the exporting rank
                tensors = [output for item in planned for output in item.outputs]
                stats.tensors += len(tensors)
                self._deliver(sink, tensors, stats)
        stats.bytes_total = stats.bytes_sent

    def _send_streamed(self, sink: WeightSink | None, consumer: str, stats: ExportStats) -> None:
        entries = _entries(self.model, self.dtype, self.is_main, consumer)
        if sink is not None and not hasattr(sink, "consume_rows"):
            entries = _whole(entries, RowAssembler(device=None))
        for entry in entries:
            stats.tensors += 1
            if isinstance(entry, RowBlock):
                stats.bytes_total += entry.nbytes
                self._route_rows(sink, entry, stats)
                continue
            hf_name, tensor, is_view = entry
            stats.bytes_total += tensor.numel() * tensor.element_size()
            self._route(sink, hf_name, tensor, is_view, stats)
        self._flush(sink, stats)

    def _route(self, sink: WeightSink | None, name: str, tensor: torch.Tensor, is_view: bool,
               stats: ExportStats) -> None:
        if self.entry_filter is not None:
            kept = self.entry_filter.tensor(name, tensor)
            if not isinstance(kept, torch.Tensor):
                self._send_update(sink, kept, stats)
                return
            is_view, tensor = is_view and kept is tensor, kept  # travels in the bucket
        self._pack(sink, stats, lambda: self.bucket.add(name, tensor, defer=is_view),
                   lambda: self._deliver(sink, [(name, tensor)], stats))

    def _route_rows(self, sink: WeightSink | None, block: RowBlock, stats: ExportStats) -> None:
        if self.entry_filter is not None:
            kept = self.entry_filter.rows(block)
            if not isinstance(kept, RowBlock):
                self._send_update(sink, kept, stats)
                return
            block = kept  # travels in the bucket
        rows = (block.row_offset, block.full_shape)
        # a block may be a reused receive buffer: copied now, never deferred
        self._pack(sink, stats, lambda: self.bucket.add(block.name, block.values, rows=rows),
                   lambda: self._deliver(sink, [], stats, blocks=[block]))

    def _pack(self, sink: WeightSink | None, stats: ExportStats, add: Callable[[], bool],
              send_alone: Callable[[], None]) -> None:
        """``add`` an entry to the bucket; when it is full, hand the bucket over and add again;
        an entry larger than a bucket goes to the sink on its own (``send_alone``)."""
        if not add():
            self._flush(sink, stats)
            if not add():
                send_alone()

    def _send_update(self, sink: WeightSink | None, update: Any, stats: ExportStats) -> None:
        """The filter's ``update`` to the sink on its own (nothing for None: a dropped entry)."""
        if update is None:
            return
        if not isinstance(sink, UpdateSink):
            raise TypeError(f"{type(self.entry_filter).__name__} sends updates only a sink with "
                            f"consume_updates applies; {type(sink).__name__} has none")
        sink.consume_updates([update])
        stats.bytes_sent += update.nbytes
        stats.buckets += 1

    def _flush(self, sink: WeightSink | None, stats: ExportStats) -> None:
        if self.bucket is None or not len(self.bucket):
            return
        self._deliver(sink, self.bucket.views(), stats, blocks=self.bucket.row_blocks())
        self.bucket.clear()

    def _deliver(self, sink: WeightSink | None, tensors: list[tuple[str, torch.Tensor]],
                 stats: ExportStats, *, blocks: list[RowBlock] | tuple[()] = ()) -> None:
        if self.bucket is not None:
            self.bucket.wait()
        if sink is not None:
            if tensors:
                sink.consume(tensors)
            if blocks:
                sink.consume_rows(blocks)
        stats.bytes_sent += sum(t.numel() * t.element_size() for _, t in tensors)
        stats.bytes_sent += sum(block.nbytes for block in blocks)
        stats.buckets += 1
