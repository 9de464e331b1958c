"""Which (token, expert) pairs each block of the exact grouped experts product computes.

Every (token, chosen expert) pair is one row of the product. Here the pairs are sorted by
expert and each expert's pairs padded to whole blocks, with tensor operations of fixed shapes
and no host synchronisation (a CUDA graph captures them), for
`graft_exact.triton_experts`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class PairPlan(NamedTuple):
    """Where each (token, expert) pair goes: ``rows`` (slots of whole blocks, a pair's index or
    -1 for padding) and ``block_expert`` (each block's expert, -1 past the last)."""

    rows: torch.Tensor
    block_expert: torch.Tensor
    pair_expert: torch.Tensor  # (pairs,) each pair's expert


def plan_pairs(pair_expert: torch.Tensor, num_experts: int, block: int = 64) -> PairPlan:
    """The blocks for ``pair_expert`` ``(pairs,)`` (expert ids in ``[0, num_experts)``): each
    expert's pairs in order, padded to a multiple of ``block``. Fixed shapes (at most
    ``ceil(pairs / block) + num_experts`` blocks), no host synchronisation."""
    pairs = pair_expert.numel()
    device = pair_expert.device
    expert = pair_expert.to(torch.int64)
    order = torch.sort(expert, stable=True).indices
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device)
    counts.scatter_add_(0, expert, torch.ones_like(expert))
    padded = (counts + block - 1) // block * block
    padded_end = padded.cumsum(0)
    first_slot = padded_end - padded
    first_pair = counts.cumsum(0) - counts
    sorted_expert = expert[order]
    slot = first_slot[sorted_expert] + torch.arange(pairs, device=device) - first_pair[sorted_expert]
    blocks = -(-pairs // block) + num_experts
    rows = torch.full((blocks * block,), -1, dtype=torch.int64, device=device)
    rows[slot] = order
    block_expert = torch.searchsorted(padded_end, torch.arange(blocks, device=device) * block,
                                      right=True)
    block_expert = torch.where(block_expert < num_experts, block_expert, -1)
    return PairPlan(rows, block_expert, expert)
