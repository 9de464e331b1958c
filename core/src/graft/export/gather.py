"""Whole tensors from their shards, one parameter at a time (a collective: every rank calls it).

Parameters are FSDP2-sharded over the ``dp`` mesh dimension (``Shard(0)``), and experts of an
expert-parallel layer over two dimensions: split into blocks over ``ep``, each block sharded over
``efsdp`` (`graft.engine.distributed.parallel_dims`). `gather_expert_block` undoes the second split only (a
rank's block of experts); `gather_full` undoes both.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from graft.engine.distributed.parallel_dims import EP

# torch 2.13 renamed all_gather_into_tensor (now deprecated); torch 2.11 has only the old name.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def is_sharded(value: torch.Tensor) -> bool:
    """True for a DTensor spread over more than one rank."""
    return hasattr(value, "full_tensor") and value.device_mesh.size() > 1


def local_tensor(value: torch.Tensor) -> torch.Tensor:
    """This rank's data of ``value`` (a DTensor's local shard, or the tensor), detached."""
    return (value.to_local() if hasattr(value, "to_local") else value).detach()


def expert_mesh_dim(value: torch.Tensor) -> int | None:
    """The index of ``value``'s ``ep`` mesh dimension when it splits dim 0 (experts) over more
    than one rank there, else None."""
    from torch.distributed.tensor import Shard

    mesh = getattr(value, "device_mesh", None)
    names = (mesh.mesh_dim_names or ()) if mesh is not None else ()
    if EP not in names:
        return None
    dim = names.index(EP)
    placement = value.placements[dim]
    split = isinstance(placement, Shard) and placement.dim == 0 and mesh.size(dim) > 1
    return dim if split else None


def expert_blocks(value: torch.Tensor) -> list[tuple[int, int]]:
    """``(first expert, number of experts)`` of each ``ep`` rank's block, in ep-rank order
    (DTensor's ``Shard`` split: ``torch.chunk`` sizes)."""
    ranks = value.device_mesh.size(expert_mesh_dim(value))
    sizes = [len(chunk) for chunk in torch.arange(value.shape[0]).chunk(ranks)]
    sizes += [0] * (ranks - len(sizes))
    return [(sum(sizes[:i]), size) for i, size in enumerate(sizes)]


def gather_expert_block(value: torch.Tensor, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    """This rank's block of experts of an expert-parallel DTensor, whole along every other mesh
    dimension (cast to ``dtype`` when given); a collective over those dimensions."""
    from torch.distributed.tensor import Replicate, Shard

    dim = expert_mesh_dim(value)
    placements = [Shard(0) if i == dim else Replicate() for i in range(value.device_mesh.ndim)]
    block = value.detach().redistribute(value.device_mesh, placements).to_local()
    return block.to(dtype) if dtype is not None and block.dtype != dtype else block


def gathers_rows_directly(value: torch.Tensor) -> bool:
    """True when ``value`` is split into equal row blocks over a 1-D mesh (FSDP2's ``Shard(0)``
    with a first dimension divisible by the mesh size): one all-gather then yields the whole
    tensor in place, without DTensor's per-call redistribution work."""
    from torch.distributed.tensor import Shard

    placements = value.placements
    return (value.device_mesh.ndim == 1 and len(placements) == 1 and type(placements[0]) is Shard
            and placements[0].dim == 0 and value.shape[0] % value.device_mesh.size() == 0)


def gather_rows_into(value: torch.Tensor, out: torch.Tensor | None = None, *,
                     dtype: torch.dtype | None = None) -> torch.Tensor:
    """All-gather a row-sharded DTensor (see `gathers_rows_directly`) into ``out`` (contiguous,
    the full shape; a new tensor when None) and return it.

    With ``dtype`` each rank casts its shard first, so the collective moves the exported bytes
    (half of them for fp32 master weights exported as bf16); the result is the same as casting
    the gathered tensor.
    """
    local = local_tensor(value)
    if dtype is not None and local.dtype != dtype:
        local = local.to(dtype)
    local = local.contiguous()
    if out is None:
        out = torch.empty(value.shape, dtype=local.dtype, device=local.device)
    _all_gather_single(out, local, group=value.device_mesh.get_group())
    return out


def _gather_experts(value: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """The whole expert-parallel tensor: each rank's block, then the blocks over ``ep``."""
    block = gather_expert_block(value, dtype=dtype).contiguous()
    sizes = {size for _, size in expert_blocks(value)}
    group = value.device_mesh.get_group(expert_mesh_dim(value))
    if len(sizes) == 1:
        out = torch.empty((value.shape[0], *block.shape[1:]), dtype=block.dtype,
                          device=block.device)
        _all_gather_single(out, block, group=group)
        return out
    parts = [block.new_empty((size, *block.shape[1:])) for _, size in expert_blocks(value)]
    dist.all_gather(parts, block, group=group)
    return torch.cat(parts)


def gather_full(value: torch.Tensor, *, dtype: torch.dtype | None = None) -> tuple[torch.Tensor, bool]:
    """The whole tensor from its shards, cast to ``dtype`` if given and floating point, and
    whether it is a view of the live parameter.

    A collective for DTensors sharded over several ranks (call it on every rank); on a one-rank
    mesh the local shard already is the whole tensor.
    """
    cast = dtype if dtype is not None and value.is_floating_point() and value.dtype != dtype else None
    if not is_sharded(value):
        whole = local_tensor(value)
        return (whole.to(cast), False) if cast is not None else (whole, True)
    if expert_mesh_dim(value) is not None:
        return _gather_experts(value, cast), False
    if gathers_rows_directly(value):
        return gather_rows_into(value, dtype=cast), False
    whole = value.full_tensor().detach()
    return (whole.to(cast) if cast is not None else whole), False
