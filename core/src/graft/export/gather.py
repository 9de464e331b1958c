"""Whole tensors from FSDP2 shards, one parameter at a time (a collective: every rank calls it)."""

from __future__ import annotations

import torch
import torch.distributed as dist


def is_sharded(value: torch.Tensor) -> bool:
    """True for a DTensor spread over more than one rank."""
    return hasattr(value, "full_tensor") and value.device_mesh.size() > 1


def gathers_rows_directly(value: torch.Tensor) -> bool:
    """True when ``value`` is split into equal row blocks over a 1-D mesh (FSDP2's ``Shard(0)``
    with a first dimension divisible by the mesh size): one all-gather then yields the whole
    tensor in place, without DTensor's per-call redistribution work."""
    from torch.distributed.tensor import Shard

    placements = value.placements
    return (value.device_mesh.ndim == 1 and len(placements) == 1 and type(placements[0]) is Shard
            and placements[0].dim == 0 and value.shape[0] % value.device_mesh.size() == 0)


def gather_rows_into(value: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """All-gather a row-sharded DTensor (see `gathers_rows_directly`) into ``out`` (contiguous,
    the full shape and dtype; a new tensor when None) and return it."""
    local = value.to_local().detach().contiguous()
    if out is None:
        out = torch.empty(value.shape, dtype=local.dtype, device=local.device)
    dist.all_gather_into_tensor(out, local, group=value.device_mesh.get_group())
    return out


def gather_full(value: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """The whole tensor from its shards, and whether it is a view of the live parameter.

    A collective for DTensors sharded over several ranks (call it on every rank); on a one-rank
    mesh the local shard already is the whole tensor.
    """
    if not hasattr(value, "full_tensor"):
        return value.detach(), True
    if value.device_mesh.size() == 1:
        return value.to_local().detach(), True
    if gathers_rows_directly(value):
        return gather_rows_into(value), False
    return value.full_tensor().detach(), False
