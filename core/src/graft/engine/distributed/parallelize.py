"""Parallelizing a bare model, torchtitan-style: small ``apply_*`` helpers composed in a fixed order.

Order: activation checkpointing, then ``torch.compile`` of each block, then the
``graft_pre_shard`` hook (`apply_pre_shard_hooks`: plugins see checkpoint-wrapped blocks and real
parameters), then (families with expert parallelism) `graft.engine.distributed.expert_parallel`, then FSDP2
``fully_shard`` of every decoder block and of the root. A model family with its own
``parallelize`` composes the same helpers; `parallelize` holds every family to the steps all of
them need (model on the device, the plugins' hook run once before sharding, ``engine.ep_size``
only for families that implement it).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from graft.engine.checkpoint_groups import apply_checkpoint_groups, checkpoint_groups_applied
from graft.engine.distributed.dtype_units import shard_other_dtypes
from graft.engine.distributed.env import DistEnv
from graft.engine.distributed.parallel_dims import EP, ParallelMeshes
from graft.errors import ConfigError, PluginError
from graft.models.build import build_empty_model, build_model, load_pretrained_weights
from graft.models.family import ModelFamily
from graft.plugins import get_plugin_manager
from graft.plugins.keywords import call_with_keywords

if TYPE_CHECKING:
    from graft.config.schema import EngineConfig, GraftConfig

# Which model a build is for: the trained policy, or the frozen KL reference (no gradients).
ROLES = ("policy", "reference")

logger = logging.getLogger("graft.engine")


def apply_activation_checkpointing(model: torch.nn.Module, *, every_blocks: int = 1,
                                   blocks: Sequence[torch.nn.Module] = ()) -> None:
    """Activation checkpointing of the decoder blocks: one non-reentrant checkpoint per block
    (transformers' own wrapper), or with ``every_blocks`` > 1 (``engine.checkpoint_every_blocks``)
    one per ``every_blocks`` consecutive ``blocks`` (`graft.engine.checkpoint_groups`).

    transformers 5.23 renamed ``gradient_checkpointing_enable`` to
    ``activation_checkpointing_enable`` (the old name warns until v6) and moved the checkpoint
    from the layer's ``__call__`` into its ``forward``: module hooks (FSDP2's, a plugin's) stay
    outside the checkpoint, and a compiled block (`apply_compile`) compiles the checkpoint with
    it. Either way the backward recomputes each block from its inputs.
    """
    if every_blocks > 1:
        if not blocks:
            raise ValueError("apply_activation_checkpointing: every_blocks > 1 needs the blocks")
        groups = apply_checkpoint_groups(list(blocks), every_blocks)
        logger.debug("checkpointing %d blocks in %d groups", len(blocks), groups)
        return
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:  # transformers >= 5.23
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    logger.debug("applied activation checkpointing to the decoder blocks")


def apply_compile(blocks: Sequence[torch.nn.Module], *, dynamic: bool | None = None) -> None:
    """``torch.compile`` each block in place (parameter names are unchanged), after
    `drop_hub_kernel_routing`.

    ``dynamic=False`` compiles one static graph per input shape: right with ``pad_to_length``,
    whose buckets keep the number of shapes small.
    """
    for block in blocks:
        drop_hub_kernel_routing(block)
        block.compile(dynamic=dynamic)
    logger.debug("compiled %d decoder blocks", len(blocks))


def drop_hub_kernel_routing(block: torch.nn.Module) -> None:
    """Give each module of ``block`` whose class forward is the ``kernels`` package's routing
    wrapper (transformers' ``use_kernelized_func``, on attention classes wherever ``kernels`` is
    installed: always from transformers 5.25) its class's own forward. The wrapper routes only
    after ``kernels.kernelize``, which Graft never calls; its context variable, set in every
    forward, made dynamo give up a checkpoint's graph (the recompute ran eagerly)."""
    for module in block.modules():
        original = getattr(type(module).forward, "__wrapped__", None)
        if "_kernel_funcs" in vars(module) and original is not None:
            module.forward = original.__get__(module)


def mixed_precision_policy(mode: str, device: torch.device) -> MixedPrecisionPolicy:
    """bf16 compute with fp32 gradient reduction on GPU (``auto``/``bf16``), fp32 otherwise."""
    if mode == "bf16" or (mode == "auto" and device.type == "cuda"):
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def apply_fsdp(model: torch.nn.Module, blocks: Sequence[torch.nn.Module], mesh: DeviceMesh, *,
               mp_policy: MixedPrecisionPolicy, reshard_after_forward: bool,
               expert_modules: Sequence[torch.nn.Module] = (),
               expert_mesh: DeviceMesh | None = None) -> None:
    """FSDP2 ``fully_shard``: expert modules over ``expert_mesh`` (``meshes["efsdp"]``), every
    decoder block and then the root (everything else) over ``mesh`` (``meshes["dp"]``).

    ``expert_modules`` are experts already split over ``ep`` whose forward reads its weights
    through `graft.engine.distributed.expert_parallel.local_expert_weight` (`apply_expert_parallel` does):
    that makes their gradients the data-parallel average FSDP2 gives every other parameter,
    although FSDP2 averages them over ``efsdp`` only. Each unit is sharded by `shard_unit`: a
    submodule keeping its parameters in another dtype than its unit gets a unit of its own.
    """
    if expert_modules and expert_mesh is None:
        raise ValueError("apply_fsdp: expert_modules need expert_mesh (meshes['efsdp'])")
    for experts in expert_modules:
        shard_unit(experts, mesh=expert_mesh, mp_policy=mp_policy,
                   reshard_after_forward=reshard_after_forward)
    for block in blocks:
        shard_unit(block, mesh=mesh, mp_policy=mp_policy,
                   reshard_after_forward=reshard_after_forward)
    # The root's parameters (embeddings, final norm, head) are needed again right at the start
    # of backward, so they stay unsharded after forward.
    shard_unit(model, mesh=mesh, mp_policy=mp_policy, reshard_after_forward=False)


def shard_unit(module: torch.nn.Module, *, mesh: DeviceMesh, mp_policy: MixedPrecisionPolicy,
               reshard_after_forward: bool) -> None:
    """``fully_shard(module)`` as one unit, after giving each of its submodules that keeps its
    parameters in another dtype (an fp32 router in a bf16 model) a unit of its own that
    computes in that dtype (`graft.engine.distributed.dtype_units`); submodules already sharded stay
    theirs."""
    def shard(part: torch.nn.Module, policy: MixedPrecisionPolicy) -> None:
        fully_shard(part, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)

    split = shard_other_dtypes(module, shard, mp_policy)
    if split:
        logger.debug("%s: %d submodule(s) in another dtype sharded as their own units",
                     type(module).__name__, len(split))
    fully_shard(module, mesh=mesh, mp_policy=mp_policy, reshard_after_forward=reshard_after_forward)


# Models whose graft_pre_shard hook ran; weak, so a dropped model is forgotten.
_PRE_SHARDED: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()


def apply_pre_shard_hooks(model: torch.nn.Module, *, cfg: GraftConfig, mesh: DeviceMesh | None,
                          role: str = "policy", meshes: ParallelMeshes | None = None) -> None:
    """Run every ``graft_pre_shard`` plugin on ``model``, once, before it is sharded.

    Call it after activation checkpointing (and compile) and right before `apply_fsdp`: plugins
    see checkpoint-wrapped blocks and real parameters. ``cfg`` is the root config the hook
    passes on (plugins read their ``features.<name>`` section); ``role`` is ``policy`` or
    ``reference`` (the frozen KL reference); ``meshes`` the run's `ParallelMeshes`. A custom
    ``ModelFamily.parallelize`` must call it too (passing the ``role`` and ``meshes`` it got);
    `parallelize` checks that it did.
    """
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    if isinstance(model, FSDPModule):
        raise PluginError("apply_pre_shard_hooks called on a model already sharded by "
                          "fully_shard; graft_pre_shard plugins need the unsharded model")
    if model in _PRE_SHARDED:
        raise PluginError("apply_pre_shard_hooks called twice on one model; graft_pre_shard "
                          "runs once per model build")
    get_plugin_manager().hook.graft_pre_shard(model=model, cfg=cfg, mesh=mesh, role=role,
                                              meshes=meshes)
    _PRE_SHARDED.add(model)


def check_expert_parallel(family: ModelFamily, ep: int,
                          families: Sequence[ModelFamily] = ()) -> None:
    """`ConfigError` when ``engine.ep_size`` (``ep``) > 1 but ``family`` does not implement
    expert parallelism, naming the installed families that do (``families``)."""
    if ep == 1 or family.expert_parallel:
        return
    capable = sorted(f.model_type for f in families if f.expert_parallel)
    raise ConfigError(
        f"engine.ep_size={ep}: the model family {family.model_type!r} does not implement expert "
        f"parallelism. Installed families that do: {', '.join(capable) or 'none'}. Install a "
        f"model plugin whose family supports it (e.g. graft-gpt-oss for GPT-OSS; `graft plugins` "
        f"lists what is installed) or set engine.ep_size=1.")


def parallelize(model: torch.nn.Module, family: ModelFamily, *, cfg: GraftConfig, mesh: DeviceMesh,
                device: torch.device, role: str = "policy",
                meshes: ParallelMeshes | None = None) -> torch.nn.Module:
    """Parallelize ``model`` with its family's ``parallelize`` (default: `parallelize_standard`).

    ``cfg`` is the root config (``cfg.engine`` is checked here; the family's function and the
    ``graft_pre_shard`` plugins get all of it). ``mesh`` is the data-parallel mesh, ``meshes``
    all of the run's (needed for expert parallelism). Whichever function runs, the model is on
    ``device`` before it (a model with meta parameters stays on meta and gets empty storage on
    ``device`` after sharding: fill it, `graft.models.build.load_pretrained_weights`), and it
    must have run the ``graft_pre_shard`` plugins through `apply_pre_shard_hooks` (a
    `PluginError` otherwise: the hook cannot run here afterwards, the model is sharded by
    then). ``role`` (``policy`` or ``reference``) is
    passed on to the hook. Returns the function's result.
    """
    from graft.models.registry import model_families

    ep = meshes[EP].size() if meshes is not None else 1
    check_expert_parallel(family, ep, list(model_families().values()))
    empty = any(p.is_meta for p in model.parameters())
    if not empty:
        model.to(device)
    check_checkpoint_settings(engine=cfg.engine)
    custom = family.parallelize or parallelize_standard
    result = call_with_keywords(custom, model=model, family=family, cfg=cfg, mesh=mesh,
                                device=device, role=role, meshes=meshes)
    check_checkpoint_groups(model, family, engine=cfg.engine)
    if empty:
        materialize(result, device)
    if model not in _PRE_SHARDED:
        raise PluginError(f"model family {family.model_type!r}: its parallelize function "
                          f"{getattr(custom, '__qualname__', custom)!r} did not call "
                          f"graft.engine.distributed.parallelize.apply_pre_shard_hooks (after activation "
                          f"checkpointing, before fully_shard), so graft_pre_shard plugins would "
                          f"be skipped")
    return result


def check_checkpoint_settings(*, engine: EngineConfig) -> None:
    """Before any family's ``parallelize``: ``engine.checkpoint_every_blocks`` > 1 without
    ``engine.activation_checkpointing`` is a `ConfigError`."""
    every = getattr(engine, "checkpoint_every_blocks", 1)
    if every > 1 and not engine.activation_checkpointing:
        raise ConfigError(f"engine.checkpoint_every_blocks={every} groups activation "
                          f"checkpoints, which are off: set engine.activation_checkpointing=true "
                          f"or engine.checkpoint_every_blocks=1")


def check_checkpoint_groups(model: torch.nn.Module, family: ModelFamily, *,
                            engine: EngineConfig) -> None:
    """`ConfigError` when ``engine.checkpoint_every_blocks`` > 1 but the family's
    ``parallelize`` checkpointed the blocks one by one (it did not pass the setting on to
    `apply_activation_checkpointing`)."""
    every = getattr(engine, "checkpoint_every_blocks", 1)
    if every > 1 and not checkpoint_groups_applied(list(family.decoder_blocks(model))):
        raise ConfigError(f"engine.checkpoint_every_blocks={every}: the model family "
                          f"{family.model_type!r} checkpoints its blocks one by one (its "
                          f"parallelize does not pass every_blocks to "
                          f"apply_activation_checkpointing); set engine.checkpoint_every_blocks=1")


def materialize(model: torch.nn.Module, device: torch.device) -> None:
    """Give a sharded model built with meta parameters (`graft.models.build.build_empty_model`)
    uninitialised storage on ``device`` for its shards, keeping its real buffers' values."""
    buffers = {name: buffer.detach().clone() for name, buffer in model.named_buffers()
               if not buffer.is_meta}
    model.to_empty(device=device)
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name in buffers:
                buffer.copy_(buffers[name])


def parallelize_standard(model: torch.nn.Module, family: ModelFamily, *, cfg: GraftConfig,
                         mesh: DeviceMesh, device: torch.device, role: str = "policy",
                         meshes: ParallelMeshes | None = None) -> torch.nn.Module:
    """Checkpoint, compile, let plugins transform (`apply_pre_shard_hooks`), then shard ``model``.

    ``cfg`` is the root config (``cfg.engine`` drives the steps; plugins get all of it); the model
    is already on ``device`` (`parallelize` moved it). Returns the same (now FSDP2) module.
    """
    engine = cfg.engine
    blocks = list(family.decoder_blocks(model))
    if engine.activation_checkpointing:
        apply_activation_checkpointing(model, every_blocks=engine.checkpoint_every_blocks,
                                       blocks=blocks)
    if engine.compile:
        apply_compile(blocks, dynamic=False if engine.pad_to_length else None)
    apply_pre_shard_hooks(model, cfg=cfg, mesh=mesh, role=role, meshes=meshes)
    blocks = list(family.decoder_blocks(model))  # a plugin may have replaced blocks
    apply_fsdp(model, blocks, mesh, mp_policy=mixed_precision_policy(engine.mixed_precision, device),
               reshard_after_forward=engine.reshard_after_forward)
    return model


def build_parallel_model(env: DistEnv, *, cfg: GraftConfig, role: str = "policy"
                         ) -> tuple[torch.nn.Module, ModelFamily]:
    """``cfg.model`` built (from ``cfg.trainer.seed``) and parallelized (``role``: ``policy`` or
    ``reference``, which gets no gradients); returns the sharded model and its family. ``cfg``
    is the root config: `parallelize` passes it on to the plugins.

    A preset is initialised from the seed on every rank's device (same seed, same weights). A
    local checkpoint (``model.path``) is built with meta parameters, sharded, and filled from one
    read of the checkpoint on rank 0 broadcast parameter by parameter, so a run of N ranks holds
    one copy of the model in host memory, not N (with ranks split into roles, every rank reads
    it: `graft.models.build.load_pretrained_weights`)."""
    if cfg.model.path:
        model, family = build_empty_model(cfg.model)
    else:
        model, family = build_model(cfg.model, seed=cfg.trainer.seed, device=env.device)
    if role == "reference":
        model.requires_grad_(False)
    model = parallelize(model, family, cfg=cfg, mesh=env.mesh, device=env.device, role=role,
                        meshes=env.meshes)
    if cfg.model.path:
        load_pretrained_weights(model, cfg.model, is_main=env.is_main,
                                every_rank_reads=env.role_ranks is not None, seed=cfg.trainer.seed)
    return model, family
