"""The exact kernels on CPU: a row's product, sum, softmax and activation depend only on that
row's values, never on how many rows there are, where the row sits, or how wide it is padded."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from graft_exact import reductions
from graft_exact.matmul import ROW_TILE, exact_addmm, exact_mm

ROW_COUNTS = (1, 2, 3, 7, ROW_TILE - 1, ROW_TILE, ROW_TILE + 1, 3 * ROW_TILE + 5)


@pytest.fixture(params=[1, 2, 3], ids=lambda n: f"{n}-threads")
def threads(request: pytest.FixtureRequest):
    """torch's thread count for the test (MKL splits a lone product over its threads)."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.mark.parametrize(("inner", "outer"), [(64, 128), (128, 64), (32, 8), (64, 256),
                                              (1024, 512)])
def test_a_rows_product_does_not_depend_on_the_other_rows(inner: int, outer: int,
                                                          threads: int) -> None:
    torch.manual_seed(0)
    weight = torch.randn(outer, inner)
    rows = torch.randn(max(ROW_COUNTS) + 10, inner)
    whole = exact_mm(rows, weight.t())
    for count in ROW_COUNTS:
        for first in (0, 1, 5):
            part = exact_mm(rows[first:first + count], weight.t())
            assert torch.equal(part, whole[first:first + count]), (count, first)
    shuffled = torch.randperm(rows.shape[0])
    assert torch.equal(exact_mm(rows[shuffled], weight.t()), whole[shuffled])
    torch.testing.assert_close(whole, rows @ weight.t(), rtol=1e-5, atol=1e-4)


def test_addmm_rounds_the_product_then_adds_the_bias() -> None:
    torch.manual_seed(1)
    a, b, bias = torch.randn(5, 16), torch.randn(16, 8), torch.randn(8)
    assert torch.equal(exact_addmm(bias, a, b), exact_mm(a, b) + bias)
    assert torch.equal(exact_addmm(bias, a[2:3], b), (exact_mm(a, b) + bias)[2:3])


def test_a_tree_sum_is_the_same_whatever_the_zero_padding() -> None:
    torch.manual_seed(2)
    values = torch.randn(6, 37)
    total = reductions.tree_sum(values, -1)
    for width in (64, 128, 1024):
        padded = torch.cat([values, torch.zeros(6, width - 37)], dim=-1)
        assert torch.equal(reductions.tree_sum(padded, -1), total)
    torch.testing.assert_close(total, values.sum(-1), rtol=1e-5, atol=1e-5)
    assert torch.equal(reductions.tree_sum(values[3:4], -1), total[3:4])
    assert torch.equal(reductions.tree_sum(values.t().contiguous(), 0), total)  # another layout, same sums


def test_tree_reductions_keep_torchs_signature() -> None:
    values = torch.randn(3, 4, 5)
    torch.testing.assert_close(reductions.tree_sum(values, (0, 2), keepdim=True),
                               values.sum((0, 2), keepdim=True))
    torch.testing.assert_close(reductions.tree_mean(values, -1), values.mean(-1))
    torch.testing.assert_close(reductions.tree_sum(values, None), values.sum())
    assert reductions.tree_sum(values.bfloat16(), -1).dtype == torch.bfloat16
    assert reductions.tree_sum(torch.empty(2, 0), -1).tolist() == [0.0, 0.0]


@pytest.mark.parametrize("kernel", [reductions.exact_softmax, reductions.exact_log_softmax,
                                    reductions.exact_logsumexp])
def test_a_rows_softmax_does_not_depend_on_the_other_rows(kernel) -> None:
    torch.manual_seed(3)
    rows = torch.randn(300, 129) * 4
    rows[7, :50] = float("-inf")
    whole = kernel(rows, -1)
    for first, count in ((0, 1), (7, 1), (10, 33), (0, 300)):
        assert torch.equal(kernel(rows[first:first + count], -1), whole[first:first + count])
    reference = {reductions.exact_softmax: torch.softmax, reductions.exact_log_softmax: torch.log_softmax,
                 reductions.exact_logsumexp: torch.logsumexp}[kernel]
    torch.testing.assert_close(whole, reference(rows, -1))


def test_a_row_of_minus_infinity_gives_what_torch_gives() -> None:
    rows = torch.full((2, 4), float("-inf"))
    assert torch.equal(reductions.exact_logsumexp(rows, -1), torch.logsumexp(rows, -1))


@pytest.mark.parametrize(("kernel", "reference"), [(reductions.exact_silu, F.silu),
                                                   (reductions.exact_sigmoid, torch.sigmoid)])
def test_an_activation_does_not_depend_on_the_elements_position(kernel, reference) -> None:
    torch.manual_seed(4)
    values = torch.randn(4099) * 6
    whole = kernel(values)
    for first in range(0, 40, 3):
        for count in (1, 5, 16, 17, 33, 100):
            assert torch.equal(kernel(values[first:first + count]), whole[first:first + count])
    assert torch.equal(kernel(values[::3]), whole[::3])
    torch.testing.assert_close(whole, reference(values))
