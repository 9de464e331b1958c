"""The CUDA exact kernels' logic, run by Triton's interpreter on CPU tensors (small shapes):
each row's product and sum independent of the other rows, the product's two layouts (one
program per tile, or per tile and chunk of ``K``) the same bits, the RMSNorm, rotary and SiLU
kernels close to the eager math and row-invariant (their gradients the eager form's), the
window attention equal for a packed row and decode steps over a longer cache (with and without
attention sinks), and all of them close to the reference math; the attention's gradients equal
to the CPU exact attention's differentiated (`WindowAttention` recomputes the ordinary
attention's); the grouped experts product and its gradients equal transformers' eager experts
(whose products the CPU runs).

usage: TRITON_INTERPRET=1 python triton_interpret.py   (prints OK)
"""

from __future__ import annotations

import os

import torch

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

from graft_exact import exact_kernels  # noqa: E402
from graft_exact.attention import cpu_window_attention  # noqa: E402
from graft_exact.attention_grad import invariant_attention  # noqa: E402
from graft_exact.norm import _ExactRMSNorm, eager_rms_norm  # noqa: E402
from graft_exact.rotary import _ExactRotary  # noqa: E402
from graft_exact.triton_activations import logistic  # noqa: E402
from graft_exact.triton_attention import triton_window_attention  # noqa: E402
from graft_exact.triton_experts import triton_experts_forward  # noqa: E402
from graft_exact.triton_matmul import CHUNK_K, invariant_mm  # noqa: E402
from graft_exact.triton_norm import rms_norm_rows  # noqa: E402
from graft_exact.triton_reductions import row_sum  # noqa: E402


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


def check_matmul_layouts() -> None:
    """``K`` of two chunks and a part: the split layout (a program per tile and chunk, then
    the ordered sum of their totals) gives the bits of the whole one (a program per tile
    adding its chunks' totals in order), at every ``M``."""
    torch.manual_seed(4)
    inner = 2 * CHUNK_K + 76
    a, w = torch.randn(140, inner), torch.randn(200, inner)
    whole = invariant_mm(a, w.t(), split=False)
    for first, count in ((0, 1), (0, 64), (0, 140), (64, 76)):
        rows = a[first:first + count]
        assert torch.equal(invariant_mm(rows, w.t(), split=True), whole[first:first + count])
        assert torch.equal(invariant_mm(rows, w.t()), whole[first:first + count])
    torch.testing.assert_close(whole, a @ w.t(), rtol=1e-5, atol=1e-4)


def check_norm_and_silu() -> None:
    """The RMSNorm kernel: close to transformers' formula (fp32, and bf16 with an fp32 weight),
    a row alone the bits it has among others, a row wider than the lanes; its gradients the
    eager formula's. SiLU and the sigmoid close to torch's, an element's bits the same alone."""
    torch.manual_seed(5)
    for dtype, width in ((torch.float32, 2500), (torch.bfloat16, 64)):
        x = torch.randn(3, 17, width).to(dtype)
        weight = 1 + 0.1 * torch.randn(width)
        out, rstd = rms_norm_rows(x, weight, 1e-6)
        expected = eager_rms_norm(x, weight, 1e-6)
        assert out.dtype == expected.dtype and out.shape == expected.shape
        torch.testing.assert_close(out, expected, rtol=1e-5 if dtype == torch.float32 else 8e-3,
                                   atol=1e-5 if dtype == torch.float32 else 8e-3)
        torch.testing.assert_close(rstd, x.float().pow(2).mean(-1, keepdim=True).add(1e-6).rsqrt())
        assert torch.equal(rms_norm_rows(x[1, 4:5], weight, 1e-6)[0], out[1, 4:5])
    for dtype, tolerance in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        x = torch.randn(2, 9, 40).to(dtype).requires_grad_(True)
        weight = (1 + 0.1 * torch.randn(40)).to(dtype).requires_grad_(True)
        upstream = torch.randn(2, 9, 40).to(dtype)
        (_ExactRMSNorm.apply(x, weight, 1e-6) * upstream).sum().backward()
        ours = (x.grad.clone(), weight.grad.clone())
        x.grad = weight.grad = None
        (eager_rms_norm(x, weight, 1e-6) * upstream).sum().backward()
        assert ours[0].dtype == x.grad.dtype and ours[1].dtype == weight.grad.dtype
        torch.testing.assert_close(ours, (x.grad, weight.grad), rtol=tolerance, atol=tolerance)
    values = torch.randn(3000) * 6
    for times_x, reference in ((True, torch.nn.functional.silu), (False, torch.sigmoid)):
        out = logistic(values, times_x=times_x)
        torch.testing.assert_close(out, reference(values), rtol=1e-6, atol=1e-6)
        assert torch.equal(logistic(values[1500:1501], times_x=times_x), out[1500:1501])
    assert logistic(values.view(30, 100).t(), times_x=True).shape == (100, 30)


def check_rotary() -> None:
    """The rotary kernel against transformers' form for queries laid out as the attention
    makes them (a transposed view) and tables shared by the batch: equal in fp32, within a
    rounding in bf16; its gradient the eager form's; a token's bits the same alone."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    torch.manual_seed(6)
    for dtype in (torch.float32, torch.bfloat16):
        q = torch.randn(2, 5, 3, 16).to(dtype).transpose(1, 2).requires_grad_(True)  # (B, H, L, D)
        k = torch.randn(2, 5, 1, 16).to(dtype).transpose(1, 2)
        angles = torch.randn(1, 5, 8).repeat(1, 1, 2)
        cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
        upstream = torch.randn(2, 3, 5, 16).to(dtype)
        out = _ExactRotary.apply(q, cos, sin)
        (out * upstream).sum().backward()
        ours = q.grad.clone()
        q.grad = None
        expected, expected_k = apply_rotary_pos_emb(q, k, cos, sin)
        (expected * upstream).sum().backward()
        tolerance = 1e-6 if dtype == torch.float32 else 1e-2
        torch.testing.assert_close(out, expected, rtol=tolerance, atol=tolerance)
        torch.testing.assert_close(_ExactRotary.apply(k, cos, sin), expected_k, rtol=tolerance,
                                   atol=tolerance)
        torch.testing.assert_close(ours, q.grad, rtol=tolerance, atol=tolerance)
        assert torch.equal(_ExactRotary.apply(q[1:, :, 2:3], cos[:, 2:3], sin[:, 2:3]),
                           out[1:, :, 2:3])


def check_row_sum() -> None:
    x = torch.randn(5, 2500)
    whole = row_sum(x)
    assert torch.equal(row_sum(x[2:3]), whole[2:3])
    assert torch.equal(row_sum(torch.cat([x, torch.zeros(5, 700)], -1)), whole)
    torch.testing.assert_close(whole, x.sum(-1), rtol=1e-5, atol=1e-4)


def check_attention() -> None:
    for sinks in (None, torch.randn(4)):
        check_attention_windows(sinks)


def check_attention_windows(sinks: torch.Tensor | None) -> None:
    torch.manual_seed(1)
    heads, kv_heads, dim = 4, 2, 16
    lengths = [5, 70, 9]  # 70: more than one block of keys
    total = sum(lengths)
    q = torch.randn(1, heads, total, dim)
    k, v = torch.randn(1, kv_heads, total, dim), torch.randn(1, kv_heads, total, dim)
    segment = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])
    slots = torch.arange(total)
    mask = ((segment[:, None] == segment[None, :]) & (slots[None, :] <= slots[:, None]))[None, None]
    packed = triton_window_attention(q, k, v, mask, scale=0.25, sinks=sinks)
    reference = cpu_window_attention(q, k, v, mask, scale=0.25, sinks=sinks)
    torch.testing.assert_close(packed, reference, rtol=1e-5, atol=1e-5)
    begin = 5  # the second sample: decode steps over a cache where it starts at slot 3
    cache_k, cache_v = torch.randn(1, kv_heads, 90, dim), torch.randn(1, kv_heads, 90, dim)
    cache_k[0, :, 3:73], cache_v[0, :, 3:73] = k[0, :, begin:begin + 70], v[0, :, begin:begin + 70]
    for step in (0, 1, 63, 64, 69):
        valid = (torch.arange(80) >= 3) & (torch.arange(80) <= 3 + step)
        out = triton_window_attention(q[:, :, begin + step:begin + step + 1], cache_k, cache_v,
                                      valid[None, None, None], scale=0.25, sinks=sinks)
        assert torch.equal(out[0, 0], packed[0, begin + step]), step


def check_attention_gradients() -> None:
    """The Triton attention's outputs, and the gradients of `invariant_attention` (SDPA
    recomputed) inside the exact kernels' mode (which refuses SDPA) as the trainer's backward
    runs: equal to the CPU exact attention's, differentiated operation by operation,
    for a packed row with a query that attends nothing (a mask row of pads), an additive mask
    covering fewer keys than the cache, and no mask (causal); with attention sinks, their
    gradient too."""
    torch.manual_seed(2)
    heads, kv_heads, dim = 4, 2, 16
    segment = torch.tensor([0] * 6 + [1] * 9 + [2] * 3)
    slots = torch.arange(len(segment))
    packed = (segment[:, None] == segment[None, :]) & (slots[None, :] <= slots[:, None])
    packed[-1] = False  # a query attending no key: output 0, gradient 0
    additive = torch.zeros(1, 1, 18, 15).masked_fill(~packed[:, :15][None, None], -1e30)
    additive[..., -1, :] = -1e30
    cases = ((packed[None, None], 18, False), (additive, 20, False), (None, 18, False),
             (packed[None, None], 18, True))
    for mask, keys, with_sinks in cases:
        q = torch.randn(1, heads, 18, dim, requires_grad=True)
        k = torch.randn(1, kv_heads, keys, dim, requires_grad=True)
        v = torch.randn(1, kv_heads, keys, dim, requires_grad=True)
        sinks = torch.randn(heads, requires_grad=True) if with_sinks else None
        inputs = [t for t in (q, k, v, sinks) if t is not None]
        weights = torch.randn(1, 18, heads, dim)
        with exact_kernels():
            (invariant_attention(q, k, v, mask, scale=0.25, sinks=sinks) * weights).sum().backward()
        ours = [t.grad.clone() for t in inputs]
        for t in inputs:
            t.grad = None
        # the exact math differentiated operation by operation
        reference = cpu_window_attention(q, k, v, mask, scale=0.25, sinks=sinks)
        torch.testing.assert_close(triton_window_attention(q, k, v, mask, scale=0.25, sinks=sinks),
                                   reference, rtol=1e-5, atol=1e-5)
        (reference * weights).sum().backward()
        for got, expected in zip(ours, [t.grad for t in inputs], strict=True):
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
        assert ours[2].abs().sum() > 0 and (sinks is None or ours[3].abs().sum() > 0)


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
    check_matmul_layouts()
    check_norm_and_silu()
    check_rotary()
    check_row_sum()
    check_attention()
    check_attention_gradients()
    check_experts()
    print("OK")
