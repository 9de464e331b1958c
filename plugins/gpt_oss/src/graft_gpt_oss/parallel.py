"""GPT-OSS's ``parallelize``: expert parallelism over ``meshes["ep"]``, FSDP2 for the rest.

Experts are split along dim 0 (``Shard(0)``) over the ``ep`` ranks of a group and each block is
FSDP2-sharded over the remaining ``efsdp = world / ep`` ranks; every other parameter is
FSDP2-sharded over all ranks (``dp``), as in torchtitan. The experts' forward becomes Graft's
all-to-all dispatch, the local experts as grouped GEMMs, and the all-to-all combine
(`graft.engine.apply_expert_parallel`): ``GptOssExperts`` follows transformers' experts convention
(transposed, interleaved ``gate_up_proj`` with its clamped SwiGLU in ``_apply_gate``, biases), so
the computation is transformers' own, only distributed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from graft.errors import ConfigError

if TYPE_CHECKING:
    import torch
    from torch.distributed.device_mesh import DeviceMesh

    from graft.engine import ParallelMeshes
    from graft.models import ModelFamily


def check_ep_size(num_experts: int, ep: int) -> None:
    """`ConfigError` unless ``engine.ep_size`` (``ep``) splits the experts evenly."""
    if num_experts % ep:
        divisors = [d for d in range(1, num_experts + 1) if num_experts % d == 0]
        raise ConfigError(f"engine.ep_size={ep} must divide the number of experts "
                          f"({num_experts}, num_local_experts): each ep rank holds an equal block "
                          f"of experts. Use one of {divisors} that also divides the world size.")


def expert_modules(blocks: list[torch.nn.Module]) -> list[torch.nn.Module]:
    """The experts module of every decoder block (every GPT-OSS layer is MoE)."""
    return [block.mlp.experts for block in blocks if hasattr(block.mlp, "experts")]


def parallelize_gpt_oss(model: torch.nn.Module, family: ModelFamily, *, cfg: Any,
                        mesh: DeviceMesh, device: torch.device, role: str = "policy",
                        meshes: ParallelMeshes | None = None) -> torch.nn.Module:
    """Checkpoint, compile, let plugins transform, split the experts over ``ep`` (when
    ``engine.ep_size > 1``), then FSDP2: expert blocks over ``efsdp``, the rest over ``dp``."""
    from graft.engine import (
        apply_activation_checkpointing,
        apply_compile,
        apply_expert_parallel,
        apply_fsdp,
        apply_pre_shard_hooks,
        mixed_precision_policy,
    )

    engine = cfg.engine
    ep_mesh = meshes["ep"] if meshes is not None else None
    ep = ep_mesh.size() if ep_mesh is not None else 1
    if ep > 1:
        check_ep_size(model.config.num_local_experts, ep)
    if engine.activation_checkpointing:
        apply_activation_checkpointing(model)
    if engine.compile:
        apply_compile(list(family.decoder_blocks(model)),
                      dynamic=False if engine.pad_to_length else None)
    apply_pre_shard_hooks(model, cfg=cfg, mesh=mesh, role=role, meshes=meshes)
    blocks = list(family.decoder_blocks(model))  # a plugin may have replaced blocks
    experts = expert_modules(blocks) if ep > 1 else []
    for module in experts:
        apply_expert_parallel(module, ep_mesh)
    apply_fsdp(model, blocks, mesh, expert_modules=experts,
               expert_mesh=meshes["efsdp"] if experts else None,
               mp_policy=mixed_precision_policy(engine.mixed_precision, device),
               reshard_after_forward=engine.reshard_after_forward)
    return model
