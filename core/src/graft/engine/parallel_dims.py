"""`ParallelDims`: the parallel dimensions of a run and the device mesh they lay out.

Modelled on torchtitan's ``ParallelDims``. Today two dimensions exist:

* data parallelism over every rank (``dp``): each rank trains on its own data, and parameters
  that are not experts are FSDP2-sharded over all ranks;
* expert parallelism (``ep``), which borrows ranks from data parallelism: the experts of a MoE
  layer are split over the ``ep`` ranks of a group, and each expert block is FSDP2-sharded over
  the remaining ``efsdp = world / ep`` ranks. Every rank still trains on its own data.

The meshes (`ParallelMeshes`): a world mesh ``(efsdp, ep)`` with ``ep`` innermost (an EP group is
consecutive ranks: one node's NVLink domain), and ``dp``, its flattening (all ranks, in rank
order), kept as its own handle. Sequence/context or tensor parallelism would add inner
dimensions to the world mesh and shrink ``dp``; callers ask for ``dp``, ``ep`` and ``efsdp`` by
name (``meshes["ep"]``), so they do not change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from graft.errors import ConfigError

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

DP, EP, EFSDP = "dp", "ep", "efsdp"


@dataclass(frozen=True)
class ParallelDims:
    """The sizes of the parallel dimensions of a run of ``world_size`` ranks.

    Attributes:
        world_size: ranks in the run.
        ep: expert-parallel size (``engine.ep_size``); must divide ``world_size``.
    """

    world_size: int
    ep: int = 1

    def __post_init__(self) -> None:
        if self.ep < 1 or self.world_size % self.ep:
            raise ConfigError(f"engine.ep_size={self.ep} must be a positive divisor of the world "
                              f"size {self.world_size} (ranks); expert parallelism borrows ranks "
                              f"from data parallelism, so ep_size x (world / ep_size) = world")

    @property
    def dp(self) -> int:
        """Data-parallel size: ranks that train on different data (all of them)."""
        return self.world_size

    @property
    def efsdp(self) -> int:
        """Ranks each expert block is FSDP2-sharded over: ``world_size / ep``."""
        return self.world_size // self.ep

    @property
    def expert_parallel(self) -> bool:
        """True when experts are split over more than one rank."""
        return self.ep > 1

    def build_meshes(self, device_type: str) -> ParallelMeshes:
        """The device meshes of these dimensions (a collective: every rank calls it)."""
        from torch.distributed.device_mesh import init_device_mesh

        world = init_device_mesh(device_type, (self.efsdp, self.ep), mesh_dim_names=(EFSDP, EP))
        # torch deprecates slicing a flattened dimension out of the root: keep its handle.
        return ParallelMeshes(world=world, dp=world._flatten(DP))


@dataclass(frozen=True)
class ParallelMeshes:
    """The device meshes of a run, by dimension name: ``meshes["dp"]`` (all ranks: data-parallel
    sharding and collectives), ``meshes["ep"]`` (expert dispatch), ``meshes["efsdp"]`` (sharding
    of expert blocks). ``world`` is the ``(efsdp, ep)`` mesh the last two are slices of."""

    world: DeviceMesh
    dp: DeviceMesh

    def __getitem__(self, name: str) -> DeviceMesh:
        if name == DP:
            return self.dp
        if name in (EP, EFSDP):
            return self.world[name]
        raise KeyError(f"no mesh dimension {name!r}; dimensions: {DP}, {EP}, {EFSDP}")
