"""`ParallelDims`: the parallel dimensions of a run and the device mesh they lay out.

Modelled on torchtitan's ``ParallelDims``. Three dimensions exist:

* data parallelism (``dp``): each data-parallel rank trains on its own data;
* sequence parallelism (``sp``), inner to ``dp``: the ``sp`` consecutive ranks of a group train
  on the same data, each running the forward on one contiguous part of every row (a plugin such
  as graft-ulysses makes attention see the whole row, `graft.engine.distributed.sequence_parallel`);
  parameters that are not experts are FSDP2-sharded over all ``dp x sp`` ranks (``shard``);
* expert parallelism (``ep``), which borrows ranks from the sharding ranks: the experts of a MoE
  layer are split over the ``ep`` ranks of a group, and each expert block is FSDP2-sharded over
  the remaining ``efsdp = world / ep`` ranks. Every rank still trains on its own data.

The meshes (`ParallelMeshes`): without sequence parallelism a world mesh ``(efsdp, ep)`` with
``ep`` innermost (an EP group is consecutive ranks: one node's NVLink domain), and ``dp``, its
flattening (all ranks, in rank order), which is also the sharding mesh. With ``sp > 1`` the
world mesh is ``(dp, sp, ep=1)`` and ``shard`` (= ``efsdp``) the flattening of ``(dp, sp)``.
Callers ask for a dimension by name (``meshes["sp"]``), so new dimensions do not change them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from graft.errors import ConfigError

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

DP, SP, EP, EFSDP, SHARD = "dp", "sp", "ep", "efsdp", "shard"


@dataclass(frozen=True)
class ParallelDims:
    """The sizes of the parallel dimensions of a run of ``world_size`` ranks.

    Attributes:
        world_size: ranks in the run.
        ep: expert-parallel size (``engine.ep_size``); must divide ``world_size``.
        sp: sequence-parallel size (from the plugin that provides it, `graft_parallel_dims`);
            must divide ``world_size``; ``dp = world_size / sp``.
    """

    world_size: int
    ep: int = 1
    sp: int = 1

    def __post_init__(self) -> None:
        if self.ep < 1 or self.world_size % self.ep:
            raise ConfigError(f"engine.ep_size={self.ep} must be a positive divisor of the world "
                              f"size {self.world_size} (ranks); expert parallelism borrows ranks "
                              f"from data parallelism, so ep_size x (world / ep_size) = world")
        if self.sp < 1 or self.world_size % self.sp:
            raise ConfigError(f"the sequence-parallel size {self.sp} must be a positive divisor "
                              f"of the world size {self.world_size} (ranks): dp x sp = world. "
                              f"Run on a multiple of {self.sp} ranks or change the sp size")
        if self.sp > 1 and self.ep > 1:
            raise ConfigError(f"sequence parallelism (sp={self.sp}) with expert parallelism "
                              f"(engine.ep_size={self.ep}) is not supported yet; set one of them "
                              f"to 1")

    @property
    def dp(self) -> int:
        """Data-parallel size: ranks that train on different data (``world_size / sp``)."""
        return self.world_size // self.sp

    @property
    def efsdp(self) -> int:
        """Ranks each expert block is FSDP2-sharded over: ``world_size / ep``."""
        return self.world_size // self.ep

    @property
    def expert_parallel(self) -> bool:
        """True when experts are split over more than one rank."""
        return self.ep > 1

    @property
    def sequence_parallel(self) -> bool:
        """True when every row is split over more than one rank."""
        return self.sp > 1

    def build_meshes(self, device_type: str, ranks: tuple[int, ...] | None = None
                     ) -> ParallelMeshes:
        """The device meshes of these dimensions over ``ranks`` (global ranks, in order;
        default: all). A collective: every rank of the run calls it, also for the ranks of
        another role."""
        import torch
        from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

        def mesh(shape: tuple[int, ...], names: tuple[str, ...]) -> DeviceMesh:
            if ranks is None:
                return init_device_mesh(device_type, shape, mesh_dim_names=names)
            return DeviceMesh(device_type, torch.tensor(ranks).view(shape),
                              mesh_dim_names=names)

        if not self.sequence_parallel:
            world = mesh((self.efsdp, self.ep), (EFSDP, EP))
            # torch deprecates slicing a flattened dimension out of the root: keep its handle.
            dp = world._flatten(DP)
            return ParallelMeshes(world=world, dp=dp, shard=dp)
        world = mesh((self.dp, self.sp, 1), (DP, SP, EP))
        return ParallelMeshes(world=world, dp=world[DP], shard=world[DP, SP]._flatten(SHARD),
                              sp=world[SP])


@dataclass(frozen=True)
class ParallelMeshes:
    """The device meshes of a run, by dimension name: ``meshes["shard"]`` (all ranks: FSDP2
    sharding of everything but experts), ``meshes["dp"]`` (the data-parallel ranks: loss
    normalisers, metric reductions; all ranks without sequence parallelism), ``meshes["sp"]``
    (the ranks that split one row; None without sequence parallelism), ``meshes["ep"]``
    (expert dispatch), ``meshes["efsdp"]`` (sharding of expert blocks). ``world`` is the mesh
    the others are slices or flattenings of."""

    world: DeviceMesh
    dp: DeviceMesh
    shard: DeviceMesh
    sp: DeviceMesh | None = None

    def __getitem__(self, name: str) -> DeviceMesh:
        if name == DP:
            return self.dp
        if name == SHARD:
            return self.shard
        if name == SP:
            if self.sp is None:
                raise KeyError("no sequence-parallel mesh: this run has sp = 1")
            return self.sp
        if name == EFSDP and self.sp is not None:
            return self.shard
        if name in (EP, EFSDP):
            return self.world[name]
        raise KeyError(f"no mesh dimension {name!r}; dimensions: {DP}, {SP}, {EP}, {EFSDP}, "
                       f"{SHARD}")
