"""The global gradient norm and clipping, computed on the local gradient shards.

``torch.nn.utils.clip_grad_norm_`` dispatches every norm and scale through DTensor; here the
local shards go through one multi-tensor norm per layout, one all-reduce of the sum of squares
over all ranks, and one multi-tensor scale.

Each element of a parameter must count once. A DTensor's element lives on one rank of its mesh
per ``Shard`` placement and on every rank of a ``Replicate`` dimension, so a rank's squares are
divided by the number of replicas before the sum over all ranks. Ranks outside a DTensor's mesh
hold other data (the other expert blocks of an expert-parallel layer), so they add theirs. Plain
tensors are the same on every rank and count once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch.distributed.tensor import DTensor, Replicate

from graft.engine.distributed.env import all_reduce

EPS = 1e-6


def replica_count(tensor: DTensor) -> int:
    """How many ranks of ``tensor``'s mesh hold each of its elements (its ``Replicate`` dims)."""
    mesh = tensor.device_mesh
    return math.prod(mesh.size(dim) for dim, placement in enumerate(tensor.placements)
                     if isinstance(placement, Replicate))


def _sum_of_squares(tensors: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    if not tensors:
        return torch.zeros((), dtype=torch.float32, device=device)
    return torch.stack(torch._foreach_norm(tensors)).float().square().sum()


def clip_grad_norm(parameters: Iterable[torch.nn.Parameter], max_norm: float,
                   group: torch.distributed.ProcessGroup | None = None) -> torch.Tensor:
    """Scale gradients so their global L2 norm is at most ``max_norm`` (``inf``: no clipping).

    Returns the norm before clipping (fp32), the same on every rank. Sharded (DTensor) gradients
    contribute their squares summed over the ranks of ``group`` (those that train; default: all),
    replicas counted once; plain ones count once.
    """
    by_replicas: dict[int, list[torch.Tensor]] = {}
    plain: list[torch.Tensor] = []
    for param in parameters:
        if param.grad is None:
            continue
        if isinstance(param.grad, DTensor):
            by_replicas.setdefault(replica_count(param.grad), []).append(param.grad.to_local())
        else:
            plain.append(param.grad)
    local = [t for grads in by_replicas.values() for t in grads]
    device = (local or plain)[0].device if local or plain else torch.device("cpu")
    squares = torch.zeros((), dtype=torch.float32, device=device)
    if local:
        for replicas, grads in by_replicas.items():
            squares = squares + _sum_of_squares(grads, device) / replicas
        squares = all_reduce(squares, group=group)
    squares = squares + _sum_of_squares(plain, device)
    total = squares.sqrt()
    if max_norm != float("inf") and (local or plain):
        scale = (max_norm / (total + EPS)).clamp(max=1.0)
        torch._foreach_mul_(local + plain, scale)
    return total
