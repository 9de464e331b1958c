"""Streamed weight export: one parameter at a time, through a reused bucket, into a sink.

Every rank walks the same parameters in the same order and takes part in gathering each one from
its FSDP2 shards; the exporting rank (rank 0) converts it to HF layout (``graft_export_slots``),
packs the result into a bucket of ``export.bucket_mb`` and hands full buckets to the sink. The
full state dict is never built: extra memory stays within one bucket plus the largest parameter
(for expert-parallel experts with per-expert HF tensors: one block of experts,
`graft.export.expert_blocks`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from graft.export.bucket import Bucket
from graft.export.context import ExportContext
from graft.export.copy_plan import CopyPlan, fill_bucket, plan_copies
from graft.export.delta import DeltaTracker
from graft.export.expert_blocks import ReceiveBuffers, stream_expert_blocks
from graft.export.gather import expert_blocks, expert_mesh_dim, gather_full
from graft.export.handlers import export_slots, exported_entries, meta_skeleton, passes_through
from graft.export.sinks.base import DeltaEntry, DeltaSink, WeightSink

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
    delta: bool = False

    @property
    def gb_per_s(self) -> float:
        """Full-model bytes per second (GB/s)."""
        return self.bytes_total / max(self.seconds, 1e-9) / 1e9


def _entries(model: torch.nn.Module, dtype: torch.dtype | None,
             is_main: bool) -> Iterator[tuple[str, torch.Tensor, bool]]:
    ctx = ExportContext(model, model.config.model_type, meta_skeleton(model), dtype)
    buffers = ReceiveBuffers()
    for name, value in exported_entries(model):
        if streams_expert_blocks(name, value, dtype, ctx):
            for block, offset in stream_expert_blocks(value, dtype=_cast(value, dtype),
                                                      buffers=buffers, is_main=is_main):
                block_ctx = dataclasses.replace(ctx, expert_offset=offset)
                for hf_name, tensor in export_slots(name, block, block_ctx):
                    yield hf_name, tensor, False
            continue
        full, is_view = gather_full(value, dtype=dtype)
        if not is_main:
            continue
        if passes_through(name, tuple(full.shape), full.dtype, ctx):
            yield name, full, is_view
        else:
            for hf_name, tensor in export_slots(name, full, ctx):
                yield hf_name, tensor, is_view


def _cast(value: torch.Tensor, dtype: torch.dtype | None) -> torch.dtype | None:
    """The dtype a tensor is exported in: ``dtype`` for floating-point tensors, else its own."""
    return dtype if dtype is not None and value.is_floating_point() else None


def streams_expert_blocks(name: str, value: torch.Tensor, dtype: torch.dtype | None,
                          ctx: ExportContext) -> bool:
    """True for an expert-parallel parameter whose handler maps a block of experts to HF
    tensors of its own (per-expert names): it is streamed block by block. A handler that would
    pass a block through unchanged (a fused HF layout) gets the whole tensor instead."""
    if expert_mesh_dim(value) is None:
        return False
    offset, size = expert_blocks(value)[0]
    shape = (size, *value.shape[1:])
    return not passes_through(name, shape, _cast(value, dtype) or value.dtype, ctx)


def hf_tensors(model: torch.nn.Module, *, dtype: torch.dtype | None,
               is_main: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    """Every exported tensor as ``(hf_name, tensor)``, gathered one parameter at a time.

    The Python iterator for library users. Under several ranks every rank must exhaust it (it
    gathers collectively); only ``is_main`` ranks get tensors. Tensors may be views of the
    model's parameters: copy what you keep across training steps.
    """
    for hf_name, tensor, _ in _entries(model, dtype, is_main):
        yield hf_name, tensor


class WeightExporter:
    """Exports a model to sinks again and again, keeping the delta snapshot between exports.

    A full export whose handlers pass every parameter through follows a bucket layout computed
    once (`graft.export.copy_plan`); any other export streams parameter by parameter.
    """

    def __init__(self, model: torch.nn.Module, *, bucket_bytes: int, dtype: torch.dtype | None,
                 delta: bool, is_main: bool, bucket_device: torch.device | None = None) -> None:
        self.model = model
        self.dtype = dtype
        self.is_main = is_main
        self.tracker = DeltaTracker() if delta else None
        device = bucket_device or next(model.parameters()).device
        self.bucket = Bucket(bucket_bytes, device, pin=True) if is_main else None
        self.copy_plan: CopyPlan | None = None
        if not delta:
            self.copy_plan = plan_copies(model, bucket=self.bucket, bucket_bytes=bucket_bytes,
                                         dtype=dtype)

    def export(self, sink: WeightSink | None) -> ExportStats:
        """One full or delta export into ``sink`` (None on ranks that only help gather)."""
        stats = ExportStats(delta=self.tracker is not None and bool(self.tracker.snapshot))
        started = time.perf_counter()
        if sink is not None:
            sink.begin()
        try:
            if self.copy_plan is not None:
                self._send_planned(self.copy_plan, sink, stats)
            else:
                self._send_streamed(sink, stats)
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
                stats.tensors += len(planned)
                self._deliver(sink, [(item.name, item.view) for item in planned], stats)
        stats.bytes_total = stats.bytes_sent

    def _send_streamed(self, sink: WeightSink | None, stats: ExportStats) -> None:
        for hf_name, tensor, is_view in _entries(self.model, self.dtype, self.is_main):
            stats.tensors += 1
            stats.bytes_total += tensor.numel() * tensor.element_size()
            self._route(sink, hf_name, tensor, is_view, stats)
        self._flush(sink, stats)

    def _route(self, sink: WeightSink | None, name: str, tensor: torch.Tensor, is_view: bool,
               stats: ExportStats) -> None:
        if self.tracker is not None:
            entry = self.tracker.diff(name, tensor)
            if entry is None:
                return
            if entry.rows is not None:
                self._send_delta(sink, entry, stats)
                return
            # a new or wholly changed tensor travels like a full export's, in the bucket
        if not self.bucket.add(name, tensor, defer=is_view):
            self._flush(sink, stats)
            if not self.bucket.add(name, tensor, defer=is_view):  # larger than a bucket
                self._deliver(sink, [(name, tensor)], stats)

    def _send_delta(self, sink: WeightSink | None, entry: DeltaEntry, stats: ExportStats) -> None:
        if not isinstance(sink, DeltaSink):
            raise TypeError(f"export.delta needs a sink that applies row updates; "
                            f"{type(sink).__name__} does not (it has no consume_delta)")
        sink.consume_delta([entry])
        stats.bytes_sent += entry.nbytes
        stats.buckets += 1

    def _flush(self, sink: WeightSink | None, stats: ExportStats) -> None:
        if self.bucket is None or not len(self.bucket):
            return
        self._deliver(sink, self.bucket.views(), stats)
        self.bucket.clear()

    def _deliver(self, sink: WeightSink | None, tensors: list[tuple[str, torch.Tensor]],
                 stats: ExportStats) -> None:
        if self.bucket is not None:
            self.bucket.wait()
        if sink is not None:
            sink.consume(tensors)
        stats.bytes_sent += sum(t.numel() * t.element_size() for _, t in tensors)
        stats.buckets += 1
