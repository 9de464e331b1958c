"""Streaming an expert-parallel parameter to the exporting rank one ``ep`` block at a time.

The full ``[num_experts, ...]`` tensor is never built: every rank gathers its own block over the
non-expert mesh dimensions, then the ranks of rank 0's ``ep`` group send their blocks to rank 0
in turn, which receives each into a buffer reused across blocks and parameters of one shape. The
handlers (``graft_export_slots``) get each block with ``ctx.expert_offset`` set to the global id
of its first expert; a block they pass through (a fused HF layout) travels on as a `RowBlock` of
the HF tensor, which the sink assembles, so the exporting rank's extra device memory stays
within the bucket plus one block.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.distributed as dist

from graft.export.gather import expert_blocks, expert_mesh_dim, gather_expert_block, local_tensor


class ReceiveBuffers:
    """One reusable receive buffer per (shape, dtype, device)."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[tuple[int, ...], torch.dtype, torch.device], torch.Tensor] = {}

    def get(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A buffer of this layout (its contents are whatever the last use left)."""
        key = (tuple(shape), dtype, device)
        if key not in self._buffers:
            self._buffers[key] = torch.empty(shape, dtype=dtype, device=device)
        return self._buffers[key]


def stream_expert_blocks(value: torch.Tensor, *, dtype: torch.dtype | None,
                         buffers: ReceiveBuffers,
                         is_main: bool) -> Iterator[tuple[torch.Tensor, int]]:
    """Yield ``(block, first expert id)`` on the exporting rank for each ``ep`` block of
    ``value``; other ranks yield nothing but must exhaust the iterator (they send).

    A yielded block may be a reused buffer: consume it (copy it out) before the next one. The
    exporting rank receives the other ranks' blocks into its own block's memory once that was
    consumed, when it is a copy (cast or gathered) rather than a view of the parameter, so it
    holds one block at a time.
    """
    block = gather_expert_block(value, dtype=dtype).contiguous()
    group = value.device_mesh.get_group(expert_mesh_dim(value))
    ranks = dist.get_process_group_ranks(group)
    if 0 not in ranks:  # rank 0 gets every block from its own ep group
        return
    me = ranks.index(dist.get_rank())
    is_copy = block.untyped_storage().data_ptr() != local_tensor(value).untyped_storage().data_ptr()
    spare = None  # the own block's memory, free for reuse once consumed
    for src, (offset, size) in enumerate(expert_blocks(value)):
        if src == me:
            if is_main:
                yield block, offset
            else:
                dist.send(block, dst=0)
            spare = block if is_copy else None
        elif is_main:
            if spare is not None and spare.shape[0] == size:
                received = spare
            else:
                received = buffers.get((size, *block.shape[1:]), block.dtype, block.device)
            dist.recv(received, src=ranks[src])
            yield received, offset
