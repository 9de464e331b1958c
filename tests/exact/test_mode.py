"""`exact_kernels`: which operators take the exact kernels. A forward (and its recomputation
under activation checkpointing) does; autograd's backward formulas and `ordinary_kernels`
blocks take the ordinary ones (gradients need not be batch-invariant)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from graft_exact import ExactKernelError, exact_kernels
from graft_exact import mode as exact_mode
from graft_exact.mode import ordinary_kernels
from torch.utils.checkpoint import checkpoint

aten = torch.ops.aten


@pytest.fixture
def exact_products(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...]]:
    """The shapes of the products the exact ``mm`` kernel computed."""
    calls: list[tuple[int, ...]] = []
    kernel = exact_mode.KERNELS[aten.mm.default]

    def counted(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        calls.append((*a.shape, b.shape[1]))
        return kernel(a, b)

    monkeypatch.setitem(exact_mode.KERNELS, aten.mm.default, counted)
    return calls


def test_the_forward_is_exact_and_the_backward_formulas_ordinary(exact_products) -> None:
    layer = torch.nn.Linear(16, 8, bias=False)
    x = torch.randn(5, 16, requires_grad=True)
    with exact_kernels():
        out = layer(x)
        assert exact_products == [(5, 16, 8)]
        out.square().sum().backward()
    assert exact_products == [(5, 16, 8)]  # grad_input and grad_weight: ordinary mm
    torch.testing.assert_close(x.grad, (2 * out.detach()) @ layer.weight.detach())


def test_a_forward_recomputed_in_backward_is_exact(exact_products) -> None:
    first, second = torch.nn.Linear(16, 8, bias=False), torch.nn.Linear(8, 4, bias=False)
    x = torch.randn(5, 16, requires_grad=True)
    with exact_kernels():
        out = checkpoint(lambda t: second(first(t).relu()), x, use_reentrant=False)
        assert exact_products == [(5, 16, 8), (5, 8, 4)]
        out.sum().backward()
    # the recomputation reproduces first's output (relu and second's weight need it) exactly
    assert exact_products[2:3] == [(5, 16, 8)]


def test_ordinary_kernels_lift_the_refusals_inside_the_block() -> None:
    q = torch.randn(1, 2, 4, 8)
    with exact_kernels():
        with pytest.raises(ExactKernelError, match="no exact kernel"):
            F.scaled_dot_product_attention(q, q, q)
        with ordinary_kernels():
            F.scaled_dot_product_attention(q, q, q)
        with pytest.raises(ExactKernelError):
            F.scaled_dot_product_attention(q, q, q)
