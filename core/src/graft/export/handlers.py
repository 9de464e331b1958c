"""Mapping trained parameters to Hugging Face checkpoint names and layouts.

The default handler asks transformers itself: its conversion mapping (the one ``save_pretrained``
reverses) splits fused experts (Qwen3-MoE, DeepSeek-V3) and restores original names (DeepSeek-V4)
one parameter at a time, so no per-model slot table is written by hand. Plugins handle other
layouts (expert-parallel blocks, packed formats) through ``graft_export_slots``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from graft.export.context import ExportContext
from graft.plugins import get_plugin_manager

Pairs = list[tuple[str, torch.Tensor]]
Handler = Callable[[str, torch.Tensor, ExportContext], Iterable[tuple[str, torch.Tensor]] | None]


def transformers_layout(name: str, tensor: torch.Tensor, ctx: ExportContext) -> Pairs:
    """The HF checkpoint entries of one in-memory tensor, through transformers' own mapping."""
    from transformers.core_model_loading import revert_weight_conversion

    return list(revert_weight_conversion(ctx.skeleton or ctx.model, {name: tensor}).items())


def meta_skeleton(model: torch.nn.Module) -> torch.nn.Module:
    """An unsharded copy of ``model``'s architecture on the meta device (no memory)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(model.config)


def export_slots(name: str, tensor: torch.Tensor, ctx: ExportContext) -> Pairs:
    """``graft_export_slots``: plugins first (first result wins), the core's default last."""
    return list(get_plugin_manager().hook.graft_export_slots(name=name, tensor=tensor, ctx=ctx))


_SLOTS: dict[tuple[Any, ...], list[tuple[str, tuple[int, ...]]]] = {}


def enumerate_hf_slots(name: str, shape: tuple[int, ...], dtype: torch.dtype, ctx: ExportContext,
                       handler: Handler = export_slots) -> list[tuple[str, tuple[int, ...]]]:
    """``(hf_name, shape)`` of every entry ``handler`` makes from a parameter, in its order.

    Runs the handler on a meta tensor of the parameter's shape (no memory, no data), cached per
    (handler, model type, name, shape, dtype, expert offset).
    """
    key = (handler, ctx.model_type, name, tuple(shape), dtype, ctx.expert_offset)
    if key not in _SLOTS:
        dummy = torch.empty(tuple(shape), dtype=dtype, device="meta")
        _SLOTS[key] = [(hf_name, tuple(t.shape)) for hf_name, t in handler(name, dummy, ctx)]
    return list(_SLOTS[key])


def exported_entries(model: torch.nn.Module) -> list[tuple[str, Any]]:
    """The tensors an export covers, in order: parameters and persistent buffers, tied ones once."""
    seen: set[int] = set()
    entries = []
    for name, value in model.state_dict(keep_vars=True).items():
        if id(value) in seen:
            continue
        seen.add(id(value))
        entries.append((name, value))
    return entries
