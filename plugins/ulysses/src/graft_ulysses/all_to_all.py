"""The two all-to-alls of Ulysses, differentiable: sequence shards <-> head shards.

Tensors are laid out as attention functions take them, ``(batch, heads, seq, dim)``. Before
attention each of the ``sp`` ranks holds every head for ``seq / sp`` tokens; `seq_to_heads`
gives it ``heads / sp`` heads for the whole sequence. `heads_to_seq` is the way back. Each is the
other's backward, so gradients reach the rank that owns each token.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

# Bytes sent by this process's all-to-alls since the last `take_bytes` (a metric).
_sent = [0]


def _exchange(x: torch.Tensor, scatter_dim: int, gather_dim: int,
              group: dist.ProcessGroup) -> torch.Tensor:
    """Split ``x`` into ``sp`` chunks along ``scatter_dim``, send chunk ``i`` to rank ``i``, and
    concatenate what arrives (in rank order) along ``gather_dim``."""
    size = dist.get_world_size(group)
    chunks = [c.contiguous() for c in x.chunk(size, dim=scatter_dim)]
    send = torch.stack(chunks)  # (sp, ...chunk): one contiguous buffer for all_to_all_single
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=group)
    _sent[0] += send.numel() * send.element_size()
    return torch.cat(received.unbind(0), dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scatter_dim: int, gather_dim: int,
                group: dist.ProcessGroup) -> torch.Tensor:
        ctx.dims, ctx.group = (scatter_dim, gather_dim), group
        return _exchange(x, scatter_dim, gather_dim, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        scatter_dim, gather_dim = ctx.dims
        return _exchange(grad, gather_dim, scatter_dim, ctx.group), None, None, None


def seq_to_heads(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """``(B, H, S / sp, D)`` on each rank -> ``(B, H / sp, S, D)``: rank ``r`` gets heads
    ``[r H / sp, (r + 1) H / sp)`` of every token."""
    return _AllToAll.apply(x, 1, 2, group)


def heads_to_seq(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """``(B, H / sp, S, D)`` on each rank -> ``(B, H, S / sp, D)``: back to sequence shards."""
    return _AllToAll.apply(x, 2, 1, group)


def take_bytes() -> int:
    """Bytes this process's all-to-alls sent since the last call (forward and backward)."""
    sent, _sent[0] = _sent[0], 0
    return sent
