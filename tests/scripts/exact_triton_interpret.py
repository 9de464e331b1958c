"""The CUDA exact kernels' logic, run by Triton's interpreter on CPU tensors (small shapes):
each row's product and sum independent of the other rows, the window attention equal for a
packed row and decode steps over a longer cache, and all of them close to the reference math;
the attention's gradients equal to the CPU exact attention's (the Triton kernel has none of its
own: `WindowAttention` gives it the ordinary attention's); the grouped experts product and its
gradients equal transformers' eager experts (whose products the CPU runs).

usage: TRITON_INTERPRET=1 python exact_triton_interpret.py   (prints OK)
"""

from __future__ import annotations

import os

import torch

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

from graft.engine.exact import exact_kernels  # noqa: E402
from graft.engine.exact.attention import exact_attention_forward  # noqa: E402
from graft.engine.exact.triton_attention import invariant_attention  # noqa: E402
from graft.engine.exact.triton_experts import triton_experts_forward  # noqa: E402
from graft.engine.exact.triton_matmul import invariant_mm  # noqa: E402
from graft.engine.exact.triton_reductions import row_sum  # noqa: E402


def check_matmul() -> None:
    """Rows at the same place of a tile, in products of other sizes. (The interpreter's
    ``tl.dot`` is numpy's BLAS, whose result for a row moves with the row's place in a tile;
    the GPU's MMA instructions do not: bench/exact_kernels.py checks that on the GPU.)"""
    torch.manual_seed(0)
    a, w = torch.randn(140, 96), torch.randn(72, 96)
    whole = invariant_mm(a, w.t())
    for first, count in ((0, 1), (0, 3), (64, 1), (64, 70), (0, 140), (128, 12)):
        assert torch.equal(invariant_mm(a[first:first + count], w.t()), whole[first:first + count])
    torch.testing.assert_close(whole, a @ w.t(), rtol=1e-5, atol=1e-4)


def check_row_sum() -> None:
    x = torch.randn(5, 2500)
    whole = row_sum(x)
    assert torch.equal(row_sum(x[2:3]), whole[2:3])
    assert torch.equal(row_sum(torch.cat([x, torch.zeros(5, 700)], -1)), whole)
    torch.testing.assert_close(whole, x.sum(-1), rtol=1e-5, atol=1e-4)


def check_attention() -> None:
    torch.manual_seed(1)
    heads, kv_heads, dim = 4, 2, 16
    lengths = [5, 70, 9]  # 70: more than one block of keys
    total = sum(lengths)
    q = torch.randn(1, heads, total, dim)
    k, v = torch.randn(1, kv_heads, total, dim), torch.randn(1, kv_heads, total, dim)
    segment = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])
    slots = torch.arange(total)
    mask = ((segment[:, None] == segment[None, :]) & (slots[None, :] <= slots[:, None]))[None, None]
    packed = invariant_attention(q, k, v, mask, scale=0.25)
    reference = exact_attention_forward(torch.nn.Module(), q, k, v, mask, scaling=0.25)[0]
    torch.testing.assert_close(packed, reference, rtol=1e-5, atol=1e-5)
    begin = 5  # the second sample: decode steps over a cache where it starts at slot 3
    cache_k, cache_v = torch.randn(1, kv_heads, 90, dim), torch.randn(1, kv_heads, 90, dim)
    cache_k[0, :, 3:73], cache_v[0, :, 3:73] = k[0, :, begin:begin + 70], v[0, :, begin:begin + 70]
    for step in (0, 1, 63, 64, 69):
        valid = (torch.arange(80) >= 3) & (torch.arange(80) <= 3 + step)
        out = invariant_attention(q[:, :, begin + step:begin + step + 1], cache_k, cache_v,
                                  valid[None, None, None], scale=0.25)
        assert torch.equal(out[0, 0], packed[0, begin + step]), step


def check_attention_gradients() -> None:
    """Gradients through the Triton attention, inside the exact kernels' mode (which refuses
    SDPA) as the trainer's backward runs: equal to the differentiable CPU exact attention's,
    for a packed row with a query that attends nothing (a mask row of pads), an additive mask
    covering fewer keys than the cache, and no mask (causal)."""
    torch.manual_seed(2)
    heads, kv_heads, dim = 4, 2, 16
    segment = torch.tensor([0] * 6 + [1] * 9 + [2] * 3)
    slots = torch.arange(len(segment))
    packed = (segment[:, None] == segment[None, :]) & (slots[None, :] <= slots[:, None])
    packed[-1] = False  # a query attending no key: output 0, gradient 0
    additive = torch.zeros(1, 1, 18, 15).masked_fill(~packed[:, :15][None, None], -1e30)
    additive[..., -1, :] = -1e30
    for mask, keys in ((packed[None, None], 18), (additive, 20), (None, 18)):
        q = torch.randn(1, heads, 18, dim, requires_grad=True)
        k = torch.randn(1, kv_heads, keys, dim, requires_grad=True)
        v = torch.randn(1, kv_heads, keys, dim, requires_grad=True)
        weights = torch.randn(1, 18, heads, dim)
        with exact_kernels():
            (invariant_attention(q, k, v, mask, scale=0.25) * weights).sum().backward()
        ours = [t.grad.clone() for t in (q, k, v)]
        for t in (q, k, v):
            t.grad = None
        reference = exact_attention_forward(torch.nn.Module(), q, k, v, mask, scaling=0.25)[0]
        (reference * weights).sum().backward()
        for got, expected in zip(ours, (q.grad, k.grad, v.grad), strict=True):
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
        assert ours[2].abs().sum() > 0


def check_experts() -> None:
    """tiny-qwen3-moe's experts (8 experts, top-2) on 70 tokens (a block of 64 pairs and more
    per busy expert): the Triton experts inside the exact mode against transformers' eager
    loop, outputs and the gradients of the hidden states, both weights and the routing weights.
    One token alone gets the output it has in the batch (its rows sit elsewhere in their
    tiles: equal within the interpreter's numpy rounding, bit-equal on a GPU)."""
    from transformers import AutoModelForCausalLM

    from graft.models.builtin import tiny_qwen3_moe

    torch.manual_seed(3)
    experts = AutoModelForCausalLM.from_config(tiny_qwen3_moe()).model.layers[0].mlp.experts
    hidden = torch.randn(70, experts.gate_up_proj.shape[-1], requires_grad=True)
    scores = torch.randn(70, experts.num_experts)
    scores[:40, 2] += 4.0  # one expert gets more than a block of pairs
    weights, chosen = scores.softmax(-1).topk(2, dim=-1)
    weights.requires_grad_(True)
    upstream = torch.randn(70, hidden.shape[1])
    with exact_kernels():
        out = triton_experts_forward(experts, hidden, chosen, weights)
        (out * upstream).sum().backward()
        alone = triton_experts_forward(experts, hidden[5:6], chosen[5:6], weights[5:6])
    ours = [t.grad.clone() for t in (hidden, experts.gate_up_proj, experts.down_proj, weights)]
    for t in (hidden, experts.gate_up_proj, experts.down_proj, weights):
        t.grad = None
    reference = type(experts).forward.__wrapped__(experts, hidden, chosen, weights)
    (reference * upstream).sum().backward()
    torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(alone, out[5:6], rtol=1e-5, atol=1e-6)
    theirs = (hidden.grad, experts.gate_up_proj.grad, experts.down_proj.grad, weights.grad)
    for got, expected in zip(ours, theirs, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
        assert expected.abs().sum() > 0


if __name__ == "__main__":
    check_matmul()
    check_row_sum()
    check_attention()
    check_attention_gradients()
    check_experts()
    print("OK")
