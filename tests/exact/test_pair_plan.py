"""`plan_pairs`: the blocks of the exact grouped experts product. Every (token, expert) pair
lands in exactly one slot, in a block of its own expert, each expert's pairs in their order;
the rest is padding, and blocks past the last expert's say so."""

from __future__ import annotations

import pytest
import torch
from graft_exact.pair_plan import plan_pairs


@pytest.mark.parametrize(("experts", "block"), [([3, 0, 3, 1, 3, 0, 7, 3], 2),
                                                 ([5] * 9, 4), ([0, 1, 2, 3], 8), ([], 4)])
def test_every_pair_lands_once_in_a_block_of_its_expert(experts: list[int], block: int) -> None:
    pair_expert = torch.tensor(experts, dtype=torch.int64)
    plan = plan_pairs(pair_expert, num_experts=8, block=block)
    blocks = plan.block_expert.numel()
    assert plan.rows.numel() == blocks * block
    assert blocks == -(-len(experts) // block) + 8  # fixed by the shapes alone
    slots = plan.rows.view(blocks, block)
    placed = plan.rows[plan.rows >= 0]
    assert sorted(placed.tolist()) == list(range(len(experts)))
    for index, (row, expert) in enumerate(zip(slots, plan.block_expert.tolist(), strict=True)):
        pairs = row[row >= 0]
        if expert < 0:
            assert pairs.numel() == 0, index  # past the last expert's blocks
            continue
        assert all(experts[p] == expert for p in pairs.tolist())
    for expert in set(experts):  # an expert's pairs keep their order, padding after them
        mine = [p for p in placed.tolist() if experts[p] == expert]
        assert mine == [p for p, e in enumerate(experts) if e == expert]


def test_blocks_of_an_expert_are_contiguous_and_padded_at_their_end() -> None:
    plan = plan_pairs(torch.tensor([2, 2, 2, 0, 2]), num_experts=4, block=2)
    # expert 0: one block (pair 3, pad); expert 2: two blocks (pairs 0 1, 2 4); then unused
    assert plan.rows.tolist()[:6] == [3, -1, 0, 1, 2, 4]
    assert plan.block_expert.tolist() == [0, 2, 2, -1, -1, -1, -1]
