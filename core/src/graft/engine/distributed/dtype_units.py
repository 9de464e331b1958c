"""FSDP2 units of one parameter dtype, for models that keep some parameters in another dtype.

FSDP2 shards each ``fully_shard`` unit's parameters as one flat group and refuses a unit whose
trainable parameters mix dtypes ("FSDP expects uniform original parameter dtype"). A model may
keep some parameters in another dtype than the rest on purpose: transformers 5.24 keeps
DeepSeek-V3's router weight, and DeepSeek-V4's norms, attention sinks and hyper-connections, in
fp32 in a bf16 model (``_keep_in_fp32_modules_strict``: routing scores and normalisation need
the precision; 5.19 kept only buffers there). Casting those masters to the block's dtype would
undo what the model asks for, so `shard_other_dtypes` gives every submodule whose parameters
are in another dtype than the unit it sits in a unit of its own, which computes in its own
dtype (the run's mixed-precision policy casts only the parameters stored in the unit's dtype;
gradients reduce in the policy's reduce dtype). A model whose masters share one dtype (fp32
masters, ``model.dtype=float32``) has nothing to split and is sharded exactly as before.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import torch
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy

Shard = Callable[[torch.nn.Module, MixedPrecisionPolicy], None]


def own_dtype_policy(policy: MixedPrecisionPolicy) -> MixedPrecisionPolicy:
    """``policy`` for a unit split off by dtype: parameters stay in their own dtype for compute
    (no cast), gradients reduce as ``policy`` says."""
    return MixedPrecisionPolicy(param_dtype=None, reduce_dtype=policy.reduce_dtype,
                                output_dtype=None, cast_forward_inputs=False)


def shard_other_dtypes(unit: torch.nn.Module, shard: Shard,
                       policy: MixedPrecisionPolicy) -> list[torch.nn.Module]:
    """Before ``fully_shard(unit)``: shard (``shard(module, own_dtype_policy(policy))``) each
    submodule of ``unit`` whose parameters are all of another dtype than those ``unit`` keeps,
    so that every unit holds one dtype. ``unit`` keeps the dtype of its own direct parameters,
    else the dtype of most of its parameters' elements. Submodules already sharded are skipped.
    Returns the modules sharded, outermost last. A `ValueError` names a module whose own direct
    trainable parameters mix dtypes (no unit can hold them)."""
    sharded: list[torch.nn.Module] = []

    def split_off(module: torch.nn.Module) -> None:
        shard(module, own_dtype_policy(policy))
        sharded.append(module)

    _split(unit, "", split_off)
    return sharded


def _split(module: torch.nn.Module, name: str,
           split_off: Callable[[torch.nn.Module], None]) -> torch.dtype | None:
    """Split ``module``'s subtree so that what it still holds has one dtype; return that dtype
    (``None``: no parameters left to it)."""
    kept: dict[torch.nn.Module, torch.dtype | None] = {}
    for child_name, child in module.named_children():
        if not isinstance(child, FSDPModule):
            kept[child] = _split(child, f"{name}.{child_name}".lstrip("."), split_off)
    own = _own_dtype(module, name)
    held = {dtype for dtype in kept.values() if dtype is not None} | ({own} if own else set())
    if len(held) <= 1:
        return next(iter(held), None)
    keep = own or _largest_dtype(kept)
    for child, dtype in kept.items():
        if dtype is not None and dtype != keep:
            split_off(child)
    return keep


def _own_dtype(module: torch.nn.Module, name: str) -> torch.dtype | None:
    """The dtype of ``module``'s direct floating-point parameters (the trainable ones' if any)."""
    params = [p for p in module.parameters(recurse=False) if p.dtype.is_floating_point]
    trainable = {p.dtype for p in params if p.requires_grad}
    if len(trainable) > 1:
        raise ValueError(
            f"module {name or type(module).__name__!r} holds trainable parameters of dtypes "
            f"{sorted(map(str, trainable))} itself; FSDP2 shards one dtype per unit, so they "
            f"cannot be sharded. Keep them in one dtype (model.dtype) or in submodules of "
            f"their own.")
    if trainable:
        return next(iter(trainable))
    frozen = Counter(p.dtype for p in params)
    return frozen.most_common(1)[0][0] if frozen else None


def _largest_dtype(kept: dict[torch.nn.Module, torch.dtype | None]) -> torch.dtype:
    """The dtype most of the children's parameter elements are in."""
    elements: Counter[torch.dtype] = Counter()
    for child, dtype in kept.items():
        if dtype is not None:
            elements[dtype] += sum(p.numel() for p in child.parameters() if p.dtype == dtype)
    return elements.most_common(1)[0][0]
