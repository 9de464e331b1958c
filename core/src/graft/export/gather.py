"""Whole tensors from FSDP2 shards, one parameter at a time (a collective: every rank calls it)."""

from __future__ import annotations

import torch
import torch.distributed as dist


def is_sharded(value: torch.Tensor) -> bool:
    """True for a DTensor spread over more than one rank."""
    return hasattr(value, "full_tensor") and value.device_mesh.size() > 1


def local_tensor(value: torch.Tensor) -> torch.Tensor:
    """This rank's data of ``value`` (a DTensor's local shard, or the tensor), detached."""
    return (value.to_local() if hasattr(value, "to_local") else value).detach()


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
    dist.all_gather_into_tensor(out, local, group=value.device_mesh.get_group())
    return out


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
    if gathers_rows_directly(value):
        return gather_rows_into(value, dtype=cast), False
    whole = value.full_tensor().detach()
    return (whole.to(cast) if cast is not None else whole), False
