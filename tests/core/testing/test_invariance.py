"""`graft.testing.invariance`'s pieces: the split, the fixed data and the comparisons fail when
they should (the end-to-end use is tests/core/engine/test_loss_invariance.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from graft.testing.invariance import (
    assert_modes_differ,
    assert_same_gradients,
    fixed_token_samples,
    rank_groups,
)


def test_rank_groups_deal_every_sample_once() -> None:
    one = rank_groups(16, rank=0, world_size=1, micro_batches=4)
    two = [rank_groups(16, rank=r, world_size=2, micro_batches=1) for r in range(2)]
    assert sorted(i for group in one for i in group) == list(range(16))
    assert sorted(i for rank in two for group in rank for i in group) == list(range(16))
    assert two[1] == [[1, 3, 5, 7, 9, 11, 13, 15]]


def test_fixed_samples_repeat_and_one_has_no_response() -> None:
    first, again = fixed_token_samples(), fixed_token_samples()
    assert [s.input_ids for s in first] == [s.input_ids for s in again]
    assert first[5].response_start == len(first[5])
    assert all(0 < s.response_start < len(s) for i, s in enumerate(first) if i != 5)


def save(folder: Path, mode: str, **grads: torch.Tensor) -> Path:
    folder.mkdir(exist_ok=True)
    torch.save(grads, folder / f"{mode}.pt")
    return folder


def test_same_gradients_pass_and_a_moved_element_fails(tmp_path: Path) -> None:
    grad = torch.linspace(-1, 1, 64)
    one = save(tmp_path / "one", "token-mean", w=grad)
    save(tmp_path / "two", "token-mean", w=grad + 1e-8)
    assert_same_gradients(one, tmp_path / "two", "token-mean")
    moved = grad.clone()
    moved[3] += 1e-4
    save(tmp_path / "three", "token-mean", w=moved)
    with pytest.raises(AssertionError, match="token-mean w: max diff"):
        assert_same_gradients(one, tmp_path / "three", "token-mean")


def test_zero_gradients_fail(tmp_path: Path) -> None:
    zero = save(tmp_path / "zero", "token-mean", w=torch.zeros(8))
    with pytest.raises(AssertionError, match="the gradient is zero"):
        assert_same_gradients(zero, zero, "token-mean")


def test_modes_giving_one_gradient_fail(tmp_path: Path) -> None:
    folder = tmp_path / "modes"
    save(folder, "a", w=torch.ones(4))
    save(folder, "b", w=torch.ones(4))
    with pytest.raises(AssertionError, match="a and b give the same gradient"):
        assert_modes_differ(folder, "w", modes=("a", "b"))
