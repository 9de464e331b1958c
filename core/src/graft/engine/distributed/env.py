"""Process group, device and mesh: the same code path for 1 process and for torchrun ranks.

A single process without torchrun still gets a (world size 1) process group and a mesh, so the
model is always an FSDP2 module and checkpoints always have the same format. The mesh's layout
(data and expert parallelism) is `graft.engine.distributed.parallel_dims.ParallelDims`'s.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from graft.engine.distributed.parallel_dims import ParallelDims, ParallelMeshes
from graft.errors import ConfigError

if TYPE_CHECKING:
    from graft.config.schema import GraftConfig

# The role of the ranks that train; a plugin's roles (``graft_rank_roles``) add others.
TRAINER = "trainer"


@dataclass(frozen=True)
class DistEnv:
    """This process's place in the run: its rank, device, parallel dimensions and meshes.

    ``mesh`` is the sharding mesh (all ranks: what non-expert parameters are sharded over);
    ``meshes`` holds every dimension's mesh by name. Data is split over the ``dp`` ranks; the
    ``sp`` ranks of one data-parallel rank share its data and split every row
    (`graft.engine.distributed.sequence_parallel`).
    """

    rank: int
    world_size: int
    device: torch.device
    dims: ParallelDims
    meshes: ParallelMeshes
    # With roles (``graft_rank_roles``): this rank's role and the global ranks that have it;
    # ``rank`` and ``world_size`` then count within the role, `group` spans it.
    role: str = TRAINER
    role_ranks: tuple[int, ...] | None = None

    @property
    def group(self) -> dist.ProcessGroup | None:
        """The process group of this rank's role, for collectives every rank of the role
        joins (checkpoints, exports, agreement on metadata); None (the default group: every
        rank) when the run has no roles."""
        return None if self.role_ranks is None else self.mesh.get_group()

    @property
    def mesh(self) -> DeviceMesh:
        """The sharding mesh (``meshes["shard"]``: all ranks; the data-parallel mesh without
        sequence parallelism)."""
        return self.meshes.shard

    @property
    def is_main(self) -> bool:
        """True on rank 0 (of the trainers, with roles), the rank that writes files and
        prints."""
        return self.rank == 0 and self.role == TRAINER

    @property
    def dp_size(self) -> int:
        """Data-parallel size: how many ranks train on different data (the ``dp`` dimension)."""
        return self.meshes.dp.size()

    @property
    def dp_rank(self) -> int:
        """This rank's index along ``dp``: which share of each batch it trains on."""
        return self.meshes.dp.get_local_rank()

    @property
    def dp_group(self) -> dist.ProcessGroup:
        """The process group of the ``dp`` dimension (loss normalisers, metric reductions)."""
        return self.meshes.dp.get_group()

    @property
    def sp_size(self) -> int:
        """Sequence-parallel size: how many ranks split each row of this rank's data (1: none)."""
        return self.dims.sp

    @property
    def sp_rank(self) -> int:
        """This rank's index along ``sp``: which part of every row its forward computes."""
        return self.meshes.sp.get_local_rank() if self.meshes.sp is not None else 0

    @property
    def sp_group(self) -> dist.ProcessGroup | None:
        """The process group of the ``sp`` dimension (None without sequence parallelism)."""
        return self.meshes.sp.get_group() if self.meshes.sp is not None else None


def resolve_device(preference: str) -> torch.device:
    """``auto`` picks CUDA when available, else CPU; ``cuda`` without a GPU is a config error."""
    if preference == "cuda" and not torch.cuda.is_available():
        raise ConfigError("engine.device=cuda but no CUDA device is available; use engine.device=cpu")
    if preference == "cuda" or (preference == "auto" and torch.cuda.is_available()):
        # more ranks than GPUs on a node (a rollout worker next to a trainer) share them
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))
                            % torch.cuda.device_count())
    return torch.device("cpu")


_created_process_group = False


def init_distributed(*, device_preference: str = "auto", ep_size: int = 1,
                     sp_size: int = 1, roles: Mapping[str, Sequence[int]] | None = None
                     ) -> DistEnv:
    """Join (or create) the process group and build the device mesh; idempotent.

    ``ep_size``: expert-parallel size (``engine.ep_size``); ``sp_size``: sequence-parallel size
    (`graft.engine.distributed.sequence_parallel.sequence_parallel_size` of the config).
    ``roles``: global ranks by role (`rank_roles`), which must cover every rank once and give
    `TRAINER` some; each role gets meshes of its own (``ep_size`` and ``sp_size`` apply to the
    trainers), and the returned env is this rank's role's. None: every rank trains.
    """
    global _created_process_group
    device = resolve_device(device_preference)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        _created_process_group = True
        shared = device.type == "cuda" and ranks_share_gpus()
        backend = "nccl" if device.type == "cuda" else "gloo"
        if shared:
            backend = "cpu:gloo,cuda:nccl"  # what spans ranks of one GPU goes through host memory
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            dist.init_process_group(backend, device_id=device if device.type == "cuda"
                                    and not shared else None)
        else:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    if roles is None:
        dims = ParallelDims(dist.get_world_size(), ep=ep_size, sp=sp_size)
        return DistEnv(dist.get_rank(), dims.world_size, device, dims,
                       dims.build_meshes(device.type))
    mine = None
    for role, ranks in roles.items():  # every rank builds every role's meshes: collectives
        dims = (ParallelDims(len(ranks), ep=ep_size, sp=sp_size) if role == TRAINER
                else ParallelDims(len(ranks)))
        meshes = dims.build_meshes(device.type, ranks=tuple(ranks))
        if dist.get_rank() in ranks:
            mine = DistEnv(list(ranks).index(dist.get_rank()), len(ranks), device, dims, meshes,
                           role=role, role_ranks=tuple(ranks))
    if mine is None:
        raise ConfigError(f"rank {dist.get_rank()} has no role in {dict(roles)}")
    return mine


def ranks_share_gpus() -> bool:
    """Whether this node runs more ranks than it has GPUs (a rollout worker next to a trainer).
    No communicator is then bound to a device at start (NCCL refuses two ranks of one
    communicator on one GPU), and tensors that cross between such ranks travel in host memory
    over gloo. False without CUDA."""
    if not torch.cuda.is_available():
        return False
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1")) > torch.cuda.device_count()


def rank_roles(cfg: GraftConfig, manager: Any = None) -> dict[str, tuple[int, ...]] | None:
    """The ranks of each role a plugin gives this run (``graft_rank_roles``, for the torchrun
    world of ``$WORLD_SIZE`` ranks), checked: every rank once, rank 0 among the trainers. None:
    every rank trains (no plugin gives roles)."""
    from graft.plugins import get_plugin_manager

    world = int(os.environ.get("WORLD_SIZE", "1"))
    roles = (manager or get_plugin_manager()).hook.graft_rank_roles(cfg=cfg, world_size=world)
    if roles is None:
        return None
    roles = {name: tuple(ranks) for name, ranks in roles.items()}
    given = sorted(rank for ranks in roles.values() for rank in ranks)
    if given != list(range(world)) or 0 not in roles.get(TRAINER, ()):
        raise ConfigError(f"the ranks' roles {roles} must give each of the {world} ranks one role "
                          f"and rank 0 (which writes the run's files) the role {TRAINER!r} "
                          f"(graft_rank_roles)")
    return roles


def shutdown_distributed() -> None:
    """Destroy the process group if `init_distributed` created it (a clean exit for gloo/NCCL).

    Call it after dropping the model and optimizer: FSDP2 state keeps the group alive, and a
    group finalised during interpreter shutdown aborts the process ("terminate called without
    an active exception", seen with gloo in about one run of three).
    """
    global _created_process_group
    if _created_process_group and dist.is_initialized():
        gc.collect()  # FSDP2 modules sit in reference cycles that hold the group
        dist.destroy_process_group()
    _created_process_group = False


def end_torchrun_worker(exit_code: int = 0) -> None:
    """Leave a torchrun worker with ``exit_code`` after its run (and `shutdown_distributed`)
    without interpreter teardown.

    Even with the group destroyed, threads that gloo and FSDP2 leave behind occasionally abort
    the process while C++ statics are destroyed ("terminate called without an active
    exception", rare; seen in CI with 2 gloo ranks), which torchrun reports as a failed run.
    Python's exit handlers still run first (child processes such as a vLLM engine are stopped,
    logs flushed); only the C++ teardown is skipped. Outside torchrun: no-op.
    """
    if "LOCAL_RANK" not in os.environ:
        return
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)


def all_reduce(value: torch.Tensor, op: Any = dist.ReduceOp.SUM,
               group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """In-place all-reduce over ``group`` (default: all ranks; a no-op on one rank); returns
    ``value``."""
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(value, op=op, group=group)
    return value


def broadcast_object(value: Any, src: int = 0, group: dist.ProcessGroup | None = None) -> Any:
    """The ``value`` of rank ``src`` of ``group`` (its index there; default: every rank) on
    every rank of the group (pickled; for small metadata only)."""
    if not (dist.is_initialized() and dist.get_world_size(group) > 1):
        return value
    holder = [value]
    source = src if group is None else dist.get_global_rank(group, src)
    # through gloo where the group has it (ranks sharing a GPU: never NCCL across them)
    device = torch.device("cpu") if "gloo" in str(dist.get_backend(group)) else None
    dist.broadcast_object_list(holder, src=source, group=group, device=device)
    return holder[0]


def share_within_sp(value: Any, env: DistEnv) -> Any:
    """The first ``sp`` rank's ``value`` on every rank of its sequence-parallel group (pickled;
    ``value`` itself without sequence parallelism): the ``sp`` ranks of one data-parallel rank
    must train on the same samples, whatever each generated."""
    if env.sp_group is None:
        return value
    holder = [value]
    dist.broadcast_object_list(holder, src=dist.get_global_rank(env.sp_group, 0),
                               group=env.sp_group)
    return holder[0]
