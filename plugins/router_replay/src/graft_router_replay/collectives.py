"""Moving int16 routes between ranks: as bit-identical uint8 views.

Neither NCCL nor gloo has an int16 type (gloo fails with "Invalid scalar type" on every
collective, measured, and can leave the group unusable), so routes travel as
``contiguous().view(torch.uint8)`` (``top_k`` ids become ``2 * top_k`` bytes) and come back
with ``view(torch.int16)``. Ranks may hold different token counts; rows are padded to the
longest for the collective and trimmed after.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from graft_router_replay.routes import ROUTE_DTYPE


def all_gather_routes(routes: torch.Tensor,
                      group: dist.ProcessGroup | None = None) -> list[torch.Tensor]:
    """Every rank's int16 ``routes`` ``(tokens, ...)`` (token counts may differ), in rank order;
    call on every rank of ``group``. On one rank: ``[routes]``."""
    _check_dtype(routes)
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return [routes]
    counts = _gather_counts(routes, group)
    padded = routes.new_zeros((max(counts), *routes.shape[1:]))
    padded[:routes.shape[0]] = routes
    local = _bytes_of(padded)
    gathered = [torch.empty_like(local) for _ in counts]
    dist.all_gather(gathered, local, group=group)
    return [_routes_of(raw, padded.shape)[:count] for raw, count in zip(gathered, counts,
                                                                        strict=True)]


def broadcast_routes(routes: torch.Tensor | None, *, src: int = 0,
                     group: dist.ProcessGroup | None = None,
                     device: torch.device | None = None) -> torch.Tensor:
    """Rank ``src``'s int16 ``routes`` on every rank (the others pass None and the ``device``
    to receive on); call on every rank of ``group``."""
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return routes
    is_src = dist.get_rank() == src
    if is_src:
        _check_dtype(routes)
        device = routes.device
    shape = [list(routes.shape) if is_src else None]
    dist.broadcast_object_list(shape, src=src, group=group, device=device)
    buffer = _bytes_of(routes) if is_src else torch.empty(
        _byte_shape(shape[0]), dtype=torch.uint8, device=device)
    dist.broadcast(buffer, src=src, group=group)
    return _routes_of(buffer, torch.Size(shape[0]))


def _check_dtype(routes: torch.Tensor) -> None:
    if routes.dtype != ROUTE_DTYPE:
        raise TypeError(f"routes travel as int16, got {routes.dtype}")


def _gather_counts(routes: torch.Tensor, group: dist.ProcessGroup | None) -> list[int]:
    count = torch.tensor([routes.shape[0]], dtype=torch.int64, device=routes.device)
    counts = [torch.empty_like(count) for _ in range(dist.get_world_size(group))]
    dist.all_gather(counts, count, group=group)
    return [int(c) for c in counts]


def _byte_shape(shape: list[int]) -> list[int]:
    return [*shape[:-1], shape[-1] * 2]


def _bytes_of(routes: torch.Tensor) -> torch.Tensor:
    """The same bytes as uint8: the last dimension doubles."""
    return routes.contiguous().view(torch.uint8)


def _routes_of(raw: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    return raw.view(ROUTE_DTYPE).reshape(shape)
