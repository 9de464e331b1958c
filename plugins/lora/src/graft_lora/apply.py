"""Putting adapters on a model and reading them back: which modules get them, their initial
values, which parameters are frozen, and the merged weights an export sends."""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from graft.errors import ConfigError
from graft_lora.config import LoraConfig
from graft_lora.layers import (
    adapt_experts,
    adapt_linear,
    expert_weights,
    initial_value,
    is_adapted,
)

# Prefixes wrappers add to parameter names (activation checkpointing, torch.compile), which
# state dicts and checkpoints leave out.
_WRAPPER_PARTS = ("_checkpoint_wrapped_module.", "_orig_mod.")

# Models whose exports carry the frozen base for now (`base_only`: a rollout engine's first
# weights, the adapters following as files).
_BASE_ONLY: weakref.WeakSet[nn.Module] = weakref.WeakSet()


def clean_name(name: str) -> str:
    """``name`` as the model's state dict spells it (without wrapper prefixes)."""
    for part in _WRAPPER_PARTS:
        name = name.replace(part, "")
    return name


def apply_lora(model: nn.Module, section: LoraConfig, *, seed: int) -> int:
    """Freeze ``model`` and give adapters to its ``target_modules`` linear layers and (with
    ``experts``) its fused experts; returns how many modules were adapted. Adapters on real
    tensors get their initial values now; on meta ones (a ``model.path`` build) when the
    weights are loaded (`initialise_missing`)."""
    model.requires_grad_(False)
    scale = section.alpha / section.rank
    targets = set(section.target_modules)
    adapted = 0
    for name, module in list(model.named_modules()):
        if isinstance(module, nn.Linear) and name.rsplit(".", 1)[-1] in targets:
            adapt_linear(module, rank=section.rank, scale=scale, dropout=section.dropout)
        elif section.experts and expert_weights(module):
            adapt_experts(module, rank=section.rank, scale=scale)
        else:
            continue
        adapted += 1
    if not adapted:
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules()
                         if isinstance(m, nn.Linear)})
        raise ConfigError(f"features.lora.target_modules={section.target_modules} matches no "
                          f"linear layer of this model (its linear layers: {linear}) and it has "
                          f"no fused experts for features.lora.experts; name some of these")
    for name, param in adapter_parameters(model):
        if not param.is_meta:
            with torch.no_grad():
                param.copy_(initial_value(name, tuple(param.shape), seed))
    return adapted


def store_frozen_in(model: nn.Module, dtype: torch.dtype | None) -> None:
    """Keep ``model``'s frozen floating-point parameters in ``dtype`` (None: as they are)."""
    if dtype is None:
        return
    for param in model.parameters():
        if not param.requires_grad and param.is_floating_point():
            param.data = param.data.to(dtype)


def adapter_parameters(model: nn.Module) -> Iterator[tuple[str, nn.Parameter]]:
    """Every adapter parameter of ``model`` with its state-dict name."""
    for module_name, module in model.named_modules():
        if is_adapted(module):
            for a, b in module.adapted_weights().values():
                for part in (a, b):
                    yield clean_name(f"{module_name}.{part}"), module._parameters[part]


def frozen_names(model: nn.Module) -> set[str]:
    """State-dict names of ``model``'s parameters that do not train (the base under adapters)."""
    return {clean_name(name) for name, p in model.named_parameters() if not p.requires_grad}


def initialise_missing(model: nn.Module, missing: list[str], seed: int) -> list[str]:
    """Give the adapters among ``missing`` (after a ``model.path`` load) their initial values,
    each rank its shard of the same full tensor; returns their names."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    adapters = dict(adapter_parameters(model))
    filled = [name for name in missing if name in adapters]
    with torch.no_grad():
        for name in filled:
            param = adapters[name]
            full = initial_value(name, tuple(param.shape), seed).to(param.dtype)
            if isinstance(param, DTensor):
                full = distribute_tensor(full.to(param.device), param.device_mesh,
                                         param.placements)
            param.copy_(full)
    return filled


def merged_entries(model: nn.Module, entries: list[tuple[str, Any]]
                   ) -> list[tuple[str, Any]] | None:
    """``entries`` of an export with every adapted weight replaced by a function computing
    ``weight + scale * B @ A`` and the adapters left out (inside `base_only`: the base weights
    as they are, the adapters left out); None for a model without adapters."""
    base = model in _BASE_ONLY
    merged: dict[int, Any] = {}
    adapters: set[int] = set()
    for module in model.modules():
        if not is_adapted(module):
            continue
        for weight, (a, b) in module.adapted_weights().items():
            if not base:
                merged[id(module._parameters[weight])] = functools.partial(_merged, module, weight)
            adapters.update((id(module._parameters[a]), id(module._parameters[b])))
    if not adapters:
        return None
    return [(name, merged.get(id(value), value)) for name, value in entries
            if id(value) not in adapters]


@contextlib.contextmanager
def base_only(model: nn.Module) -> Iterator[None]:
    """Inside it, `merged_entries` of ``model`` are its frozen base without the adapters."""
    _BASE_ONLY.add(model)
    try:
        yield
    finally:
        _BASE_ONLY.discard(model)


@torch.no_grad()
def _merged(module: nn.Module, weight: str) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    base = module._parameters[weight]
    merged = (base + module.weight_delta(weight)).to(base.dtype)
    if isinstance(merged, DTensor) and merged.placements != base.placements:
        merged = merged.redistribute(placements=base.placements)
    return merged
