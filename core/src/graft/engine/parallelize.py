"""Parallelizing a bare model, torchtitan-style: small ``apply_*`` helpers composed in a fixed order.

Order: activation checkpointing, then ``torch.compile`` of each block, then the
``graft_pre_shard`` hook (`apply_pre_shard_hooks`: plugins see checkpoint-wrapped blocks and real
parameters), then FSDP2 ``fully_shard`` of every decoder block and of the root. A model family
with its own ``parallelize`` composes the same helpers; `parallelize` holds every family to the
steps all of them need (model on the device, the plugins' hook run once before sharding).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Sequence
from typing import Any

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from graft.errors import PluginError
from graft.models.family import ModelFamily
from graft.plugins import get_plugin_manager

logger = logging.getLogger("graft.engine")


def apply_activation_checkpointing(model: torch.nn.Module) -> None:
    """Non-reentrant activation checkpointing of every decoder block (transformers' own wrapper)."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    logger.debug("applied activation checkpointing to the decoder blocks")


def apply_compile(blocks: Sequence[torch.nn.Module], *, dynamic: bool | None = None) -> None:
    """``torch.compile`` each block in place (parameter names are unchanged).

    ``dynamic=False`` compiles one static graph per input shape: right with ``pad_to_length``,
    whose buckets keep the number of shapes small.
    """
    for block in blocks:
        block.compile(dynamic=dynamic)
    logger.debug("compiled %d decoder blocks", len(blocks))


def mixed_precision_policy(mode: str, device: torch.device) -> MixedPrecisionPolicy:
    """bf16 compute with fp32 gradient reduction on GPU (``auto``/``bf16``), fp32 otherwise."""
    if mode == "bf16" or (mode == "auto" and device.type == "cuda"):
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def apply_fsdp(model: torch.nn.Module, blocks: Sequence[torch.nn.Module], mesh: DeviceMesh, *,
               mp_policy: MixedPrecisionPolicy, reshard_after_forward: bool) -> None:
    """FSDP2 ``fully_shard`` on every decoder block, then on the root (everything else)."""
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=mp_policy,
                    reshard_after_forward=reshard_after_forward)
    # The root's parameters (embeddings, final norm, head) are needed again right at the start
    # of backward, so they stay unsharded after forward.
    fully_shard(model, mesh=mesh, mp_policy=mp_policy, reshard_after_forward=False)


# Models whose graft_pre_shard hook ran; weak, so a dropped model is forgotten.
_PRE_SHARDED: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()


def apply_pre_shard_hooks(model: torch.nn.Module, *, cfg: Any, mesh: DeviceMesh | None) -> None:
    """Run every ``graft_pre_shard`` plugin on ``model``, once, before it is sharded.

    Call it after activation checkpointing (and compile) and right before `apply_fsdp`: plugins
    see checkpoint-wrapped blocks and real parameters. A custom ``ModelFamily.parallelize`` must
    call it too; `parallelize` checks that it did.
    """
    if isinstance(model, FSDPModule):
        raise PluginError("apply_pre_shard_hooks called on a model already sharded by "
                          "fully_shard; graft_pre_shard plugins need the unsharded model")
    if model in _PRE_SHARDED:
        raise PluginError("apply_pre_shard_hooks called twice on one model; graft_pre_shard "
                          "runs once per model build")
    get_plugin_manager().hook.graft_pre_shard(model=model, cfg=cfg, mesh=mesh)
    _PRE_SHARDED.add(model)


def parallelize(model: torch.nn.Module, family: ModelFamily, *, cfg: Any, mesh: DeviceMesh,
                device: torch.device) -> torch.nn.Module:
    """Parallelize ``model`` with its family's ``parallelize`` (default: `parallelize_standard`).

    Whichever function runs, the model is on ``device`` before it, and it must have run the
    ``graft_pre_shard`` plugins through `apply_pre_shard_hooks` (a `PluginError` otherwise:
    the hook cannot run here afterwards, the model is sharded by then). Returns its result.
    """
    model.to(device)
    custom = family.parallelize or parallelize_standard
    result = custom(model, family, cfg=cfg, mesh=mesh, device=device)
    if model not in _PRE_SHARDED:
        raise PluginError(f"model family {family.model_type!r}: its parallelize function "
                          f"{getattr(custom, '__qualname__', custom)!r} did not call "
                          f"graft.engine.parallelize.apply_pre_shard_hooks (after activation "
                          f"checkpointing, before fully_shard), so graft_pre_shard plugins would "
                          f"be skipped")
    return result


def parallelize_standard(model: torch.nn.Module, family: ModelFamily, *, cfg: Any,
                         mesh: DeviceMesh, device: torch.device) -> torch.nn.Module:
    """Checkpoint, compile, let plugins transform (`apply_pre_shard_hooks`), then shard ``model``.

    ``cfg`` is the root config (``cfg.engine`` drives the steps; plugins get all of it); the model
    is already on ``device`` (`parallelize` moved it). Returns the same (now FSDP2) module.
    """
    engine = cfg.engine
    blocks = list(family.decoder_blocks(model))
    if engine.activation_checkpointing:
        apply_activation_checkpointing(model)
    if engine.compile:
        apply_compile(blocks, dynamic=False if engine.pad_to_length else None)
    apply_pre_shard_hooks(model, cfg=cfg, mesh=mesh)
    blocks = list(family.decoder_blocks(model))  # a plugin may have replaced blocks
    apply_fsdp(model, blocks, mesh, mp_policy=mixed_precision_policy(engine.mixed_precision, device),
               reshard_after_forward=engine.reshard_after_forward)
    return model
