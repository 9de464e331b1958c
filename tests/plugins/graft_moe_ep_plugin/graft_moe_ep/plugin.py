"""Replaces the core's qwen3_moe family by one whose ``parallelize`` splits the experts over the
mesh's ``ep`` dimension, as a third-party model plugin would: only `graft`'s public helpers."""

from __future__ import annotations

import dataclasses

from graft import hookimpl


def parallelize_with_experts(model, family, *, cfg, mesh, device, role, meshes):
    """Checkpoint, compile, plugins, then experts over ``ep`` and everything sharded."""
    from graft.engine import (
        apply_activation_checkpointing,
        apply_expert_parallel,
        apply_fsdp,
        apply_pre_shard_hooks,
        mixed_precision_policy,
    )

    engine = cfg.engine
    if engine.activation_checkpointing:  # every_blocks: engine.checkpoint_every_blocks
        apply_activation_checkpointing(model, every_blocks=engine.checkpoint_every_blocks,
                                       blocks=list(family.decoder_blocks(model)))
    apply_pre_shard_hooks(model, cfg=cfg, mesh=mesh, role=role, meshes=meshes)
    blocks = list(family.decoder_blocks(model))
    experts = [block.mlp.experts for block in blocks if hasattr(block.mlp, "experts")]
    if meshes["ep"].size() > 1:
        for module in experts:
            apply_expert_parallel(module, meshes["ep"])
    else:
        experts = []
    apply_fsdp(model, blocks, mesh, expert_modules=experts, expert_mesh=meshes["efsdp"],
               mp_policy=mixed_precision_policy(engine.mixed_precision, device),
               reshard_after_forward=engine.reshard_after_forward)
    return model


@hookimpl
def graft_model_families():
    from graft.models import BUILTIN_FAMILIES

    core = next(f for f in BUILTIN_FAMILIES if f.model_type == "qwen3_moe")
    return [dataclasses.replace(core, parallelize=parallelize_with_experts, expert_parallel=True)]
