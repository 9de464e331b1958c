"""`CopyPlan`: a full export that is nothing but copies and all-gathers, laid out once.

When every handler passes its parameter through unchanged, or slices it into views that tile it
(one tensor per expert of a fused parameter, `graft.export.handlers.tiling_slots`), and no
`ExportFilter` decides per entry, an export needs no per-tensor decisions: each parameter has a
fixed place in one of the buckets, and its exported tensors are views of that place. Parameters
split in row blocks over the ranks are all-gathered straight into that place (one write per
byte, no temporary; cast to the export dtype before the gather); the others are copied (and
cast), large ones one by one, small ones together.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from graft.export.bucket import Bucket, aligned, copy_tensors
from graft.export.context import HF_LAYOUT, ExportContext
from graft.export.gather import gather_rows_into, gathers_rows_directly, is_sharded, local_tensor
from graft.export.handlers import exported_entries, meta_skeleton, tiling_slots


@dataclass(frozen=True)
class PlannedTensor:
    """One exported parameter: its name, the live parameter, the exported dtype, its place in
    the bucket and the exported ``(hf_name, tensor)`` entries, views of that place (None and
    empty on ranks that only help gather)."""

    name: str
    value: Any
    dtype: torch.dtype
    view: torch.Tensor | None
    outputs: tuple[tuple[str, torch.Tensor], ...] = ()


@dataclass(frozen=True)
class CopyPlan:
    """The exported tensors of each bucket, in export order."""

    buckets: list[list[PlannedTensor]]


def plan_copies(model: torch.nn.Module, *, bucket: Bucket | None, bucket_bytes: int,
                dtype: torch.dtype | None, consumer: str = HF_LAYOUT) -> CopyPlan | None:
    """The bucket layout of a full export of ``model`` for ``consumer`` (floating-point tensors
    in ``dtype`` when given), or None when an export needs more than copies (a handler that
    converts other than by slicing a parameter into views that tile it, a parameter sharded
    otherwise than in equal row blocks, one larger than a bucket, or a value a plugin computes
    at each export: ``graft_export_entries``).

    Depends only on the model and the arguments, so every rank decides the same and issues the
    same all-gathers in the same order; ``bucket`` is None on ranks that only help gather.
    """
    ctx = ExportContext(model, model.config.model_type, meta_skeleton(model), dtype,
                        consumer=consumer)
    buckets: list[list[PlannedTensor]] = [[]]
    used = 0
    for name, value in exported_entries(model):
        if not isinstance(value, torch.Tensor):
            return None
        shape = tuple(value.shape)
        exported = dtype if dtype is not None and value.is_floating_point() else value.dtype
        nbytes = value.numel() * exported.itemsize
        if (is_sharded(value) and not gathers_rows_directly(value)) or nbytes > bucket_bytes:
            return None
        slots = tiling_slots(name, shape, exported, ctx)  # a pass-through is one whole tile
        if slots is None:
            return None
        start = aligned(used)
        if start + nbytes > bucket_bytes:
            buckets.append([])
            start = 0
        view, outputs = None, ()
        if bucket is not None:
            view = bucket.buffer[start:start + nbytes].view(exported).view(shape)
            outputs = tuple(_slot_views(view, slots))
        buckets[-1].append(PlannedTensor(name, value, exported, view, outputs))
        used = start + nbytes
    return CopyPlan([b for b in buckets if b])


def _slot_views(view: torch.Tensor, slots: list[tuple[str, tuple[int, ...], int]]
                ) -> list[tuple[str, torch.Tensor]]:
    """Each slot ``(hf_name, shape, element offset)`` as a view of a parameter's bucket place."""
    flat = view.view(-1)
    return [(hf_name, flat[offset:offset + math.prod(shape)].view(shape))
            for hf_name, shape, offset in slots]


def fill_bucket(planned: list[PlannedTensor]) -> None:
    """Write one bucket's tensors into their places, asynchronously on the current stream.

    A collective when the model is sharded: every rank calls it for the same bucket.
    """
    targets, sources = [], []
    for item in planned:
        value = item.value
        if is_sharded(value):
            if item.view is None or item.view.device == value.device:
                gather_rows_into(value, out=item.view, dtype=item.dtype)
            else:  # a host bucket: gather on the device, then one copy per byte to the host
                item.view.copy_(gather_rows_into(value, dtype=item.dtype), non_blocking=True)
        elif item.view is not None:
            targets.append(item.view)
            sources.append(local_tensor(value))
    copy_tensors(targets, sources)
