"""Mapping trained parameters to Hugging Face checkpoint names and layouts.

The default handler asks transformers itself: its conversion mapping (the one ``save_pretrained``
reverses) splits fused experts (Qwen3-MoE, DeepSeek-V3) and restores original names (DeepSeek-V4)
one parameter at a time, so no per-model slot table is written by hand. Plugins handle other
layouts (expert-parallel blocks, packed formats, a consumer's own layout: ``ctx.consumer``)
through ``graft_export_slots``. What a handler makes of a parameter is found once on a meta
tensor (`Probe`); the exporter plans around it (copies only, per-expert blocks, row blocks).
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from graft.export.context import ExportContext
from graft.plugins import get_plugin_manager

Pairs = list[tuple[str, torch.Tensor]]
Handler = Callable[[str, torch.Tensor, ExportContext], Iterable[tuple[str, torch.Tensor]] | None]


_EXPERT_ID = re.compile(r"(\.experts\.)(\d+)(\.)")


def transformers_layout(name: str, tensor: torch.Tensor, ctx: ExportContext) -> Pairs:
    """The HF checkpoint entries of one in-memory tensor, through transformers' own mapping.

    A block of experts (``ctx.expert_offset`` > 0) that the mapping splits per expert gets its
    ids shifted to global ones (``...experts.<offset + i>...``).
    """
    from transformers.core_model_loading import revert_weight_conversion

    pairs = list(revert_weight_conversion(ctx.skeleton or ctx.model, {name: tensor}).items())
    if not ctx.expert_offset:
        return pairs
    shift = lambda m: f"{m.group(1)}{int(m.group(2)) + ctx.expert_offset}{m.group(3)}"  # noqa: E731
    return [(_EXPERT_ID.sub(shift, hf_name, count=1), value) for hf_name, value in pairs]


_SKELETONS: weakref.WeakKeyDictionary[torch.nn.Module, torch.nn.Module] = (
    weakref.WeakKeyDictionary())


def meta_skeleton(model: torch.nn.Module) -> torch.nn.Module:
    """An unsharded copy of ``model``'s architecture on the meta device (no memory), built once
    per model."""
    from graft.models.build import meta_model

    if model not in _SKELETONS:
        _SKELETONS[model] = meta_model(model.config)
    return _SKELETONS[model]


def export_slots(name: str, tensor: torch.Tensor, ctx: ExportContext) -> Pairs:
    """``graft_export_slots``: plugins first (first result wins), the core's default last."""
    return list(get_plugin_manager().hook.graft_export_slots(name=name, tensor=tensor, ctx=ctx))


def _handler_plugins() -> tuple[str, ...]:
    """The plugins implementing ``graft_export_slots`` now (part of every cache key)."""
    hook = get_plugin_manager().hook.graft_export_slots
    return tuple(impl.plugin_name for impl in hook.get_hookimpls())


@dataclass(frozen=True)
class Probe:
    """What a handler makes of a parameter, found on a meta tensor: its ``(hf_name, shape)``
    entries; ``same_tensor``: the HF name when it returns the parameter itself as its only
    entry (renamed or not; None otherwise); ``offsets``: when its entries are contiguous views
    that tile the parameter (every element in exactly one, as one tensor per expert of a fused
    one), each entry's first element's offset in the parameter (None otherwise)."""

    entries: list[tuple[str, tuple[int, ...]]]
    same_tensor: str | None
    offsets: tuple[int, ...] | None = None


def _tile_offsets(whole: torch.Tensor, parts: list[torch.Tensor]) -> tuple[int, ...] | None:
    """Each part's element offset in ``whole`` when the parts are contiguous views of it (or it)
    in its dtype that cover each of its elements exactly once; None otherwise."""
    spans = []
    for part in parts:
        if not (part is whole or part._base is whole) or part.dtype != whole.dtype \
                or not part.is_contiguous():
            return None
        spans.append((part.storage_offset() - whole.storage_offset(), part.numel()))
    covered = 0
    for start, count in sorted(spans):
        if start != covered:
            return None
        covered += count
    return tuple(start for start, _ in spans) if covered == whole.numel() else None


_PROBES: dict[tuple[Any, ...], Probe] = {}


def _probe(name: str, shape: tuple[int, ...], dtype: torch.dtype, ctx: ExportContext,
           handler: Handler) -> Probe:
    """Run ``handler`` on a meta tensor of the parameter's shape (no memory, no data), cached
    per (plugins, handler, model type, name, shape, dtype, expert offset, consumer)."""
    key = (_handler_plugins(), handler, ctx.model_type, name, tuple(shape), dtype,
           ctx.expert_offset, ctx.consumer)
    if key not in _PROBES:
        dummy = torch.empty(tuple(shape), dtype=dtype, device="meta")
        out = list(handler(name, dummy, ctx))
        same = out[0][0] if len(out) == 1 and out[0][1] is dummy else None
        _PROBES[key] = Probe([(hf_name, tuple(t.shape)) for hf_name, t in out], same,
                             _tile_offsets(dummy, [t for _, t in out]))
    return _PROBES[key]


def enumerate_hf_slots(name: str, shape: tuple[int, ...], dtype: torch.dtype, ctx: ExportContext,
                       handler: Handler = export_slots) -> list[tuple[str, tuple[int, ...]]]:
    """``(hf_name, shape)`` of every entry ``handler`` makes from a parameter, in its order
    (found on a meta tensor, cached). ``ctx.consumer`` says for whom (HF checkpoint or
    inference engine)."""
    return list(_probe(name, shape, dtype, ctx, handler).entries)


def passes_through(name: str, shape: tuple[int, ...], dtype: torch.dtype,
                   ctx: ExportContext) -> bool:
    """True when the handlers return a parameter unchanged (same name, the tensor itself; found
    on a meta tensor, cached); such parameters skip the handler call on real data, off the
    export's hot path."""
    return _probe(name, shape, dtype, ctx, export_slots).same_tensor == name


def tiling_slots(name: str, shape: tuple[int, ...], dtype: torch.dtype,
                 ctx: ExportContext) -> list[tuple[str, tuple[int, ...], int]] | None:
    """``(hf_name, shape, element offset)`` of each entry the handlers make of a parameter when
    those entries are contiguous views tiling it (one tensor per expert of a fused parameter, a
    renamed parameter): an export can then copy the whole parameter at once and hand over views
    of the copy. None when they are anything else (copies, overlapping or partial views). Found
    on a meta tensor and cached, as `passes_through`: a handler must slice real data as it
    slices a meta tensor of the same shape."""
    probe = _probe(name, shape, dtype, ctx, export_slots)
    if probe.offsets is None:
        return None
    return [(hf_name, entry_shape, offset)
            for (hf_name, entry_shape), offset in zip(probe.entries, probe.offsets, strict=True)]


def block_hf_name(name: str, shape: tuple[int, ...], dtype: torch.dtype,
                  ctx: ExportContext) -> str | None:
    """For a block of an expert-parallel parameter (``ctx.expert_offset`` set): the HF name
    when the handlers return the block itself (a fused HF layout, renamed or not), whose rows
    it then is; None when they map it to tensors of its own (per-expert names)."""
    return _probe(name, shape, dtype, ctx, export_slots).same_tensor


def exported_entries(model: torch.nn.Module) -> list[tuple[str, Any]]:
    """The tensors an export covers, in order: parameters and persistent buffers, tied ones
    once; or what a ``graft_export_entries`` plugin exports instead (values that are functions
    are computed when their turn comes: `entry_tensor`)."""
    seen: set[int] = set()
    entries = []
    for name, value in model.state_dict(keep_vars=True).items():
        if id(value) in seen:
            continue
        seen.add(id(value))
        entries.append((name, value))
    replaced = get_plugin_manager().hook.graft_export_entries(model=model, entries=entries)
    return entries if replaced is None else replaced


def entry_tensor(value: Any) -> torch.Tensor:
    """An `exported_entries` value as a tensor: a computed one (a function) is called now (on
    every rank, in export order: it may gather)."""
    return value if isinstance(value, torch.Tensor) else value()
