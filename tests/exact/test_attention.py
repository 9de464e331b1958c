"""The exact attention: a query's output depends only on the keys it attends (from its sample's
first token), whatever the tensor holding them: a packed training row, a left-padded prefill
or a decode step over a longer cache give the same bits, with and without attention sinks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from graft_exact.attention import ExactAttentionError, exact_attention_forward

HEADS, KV_HEADS, DIM = 4, 2, 32


SINKS = torch.tensor([0.5, -1.0, 2.0, 0.0])  # a sink logit per query head


def attend(query, key, value, mask, sinks=None):
    return exact_attention_forward(torch.nn.Module(), query, key, value, mask, scaling=0.2,
                                   s_aux=sinks)[0]


def samples(lengths: list[int], seed: int = 0) -> list[tuple[torch.Tensor, ...]]:
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(HEADS, n, DIM, generator=generator),
             torch.randn(KV_HEADS, n, DIM, generator=generator),
             torch.randn(KV_HEADS, n, DIM, generator=generator)) for n in lengths]


def packed(parts, pad: int = 3, sinks=None):
    """One row: the samples back to back then ``pad`` pad tokens; a block-diagonal causal
    boolean mask. Returns the outputs per sample ``(n, H, D)``."""
    q = torch.cat([p[0] for p in parts] + [torch.randn(HEADS, pad, DIM)], dim=1)[None]
    k = torch.cat([p[1] for p in parts] + [torch.randn(KV_HEADS, pad, DIM)], dim=1)[None]
    v = torch.cat([p[2] for p in parts] + [torch.randn(KV_HEADS, pad, DIM)], dim=1)[None]
    segment = torch.cat([torch.full((p[0].shape[1],), i) for i, p in enumerate(parts)]
                        + [torch.full((pad,), len(parts))])
    slots = torch.arange(len(segment))
    mask = (segment[:, None] == segment[None, :]) & (slots[None, :] <= slots[:, None])
    out = attend(q, k, v, mask[None, None], sinks)[0]
    starts = torch.tensor([0] + [p[0].shape[1] for p in parts]).cumsum(0)
    return [out[starts[i]:starts[i + 1]] for i in range(len(parts))]


@pytest.mark.parametrize("sinks", [None, SINKS])
def test_a_sample_attends_the_same_anywhere_in_a_packed_row(sinks) -> None:
    parts = samples([5, 17, 9, 33])
    alone = [packed([p], pad=0, sinks=sinks)[0] for p in parts]
    for order in ([0, 1, 2, 3], [3, 1, 0, 2], [2, 3]):
        for index, out in zip(order, packed([parts[i] for i in order], sinks=sinks), strict=True):
            assert torch.equal(out, alone[index])


@pytest.mark.parametrize("sinks", [None, SINKS])
def test_prefill_and_decode_steps_over_a_cache_attend_as_the_packed_row_does(sinks) -> None:
    parts = samples([6, 11, 3], seed=1)
    trained = packed(parts, sinks=sinks)
    cache = 24
    width = max(p[0].shape[1] for p in parts)
    for row, (q, k, v) in enumerate(parts):
        n = q.shape[1]
        pad = width - n + row + 1  # left padding differs per row
        keys = torch.randn(1, KV_HEADS, cache, DIM)
        values = torch.randn(1, KV_HEADS, cache, DIM)
        keys[0, :, pad:pad + n], values[0, :, pad:pad + n] = k, v
        # prefill of the first tokens: queries of the pad attend themselves only
        prompt = n - 2 if n > 2 else n
        queries = torch.randn(1, HEADS, pad + prompt, DIM)
        queries[0, :, pad:] = q[:, :prompt]
        slots = torch.arange(pad + prompt)
        mask = ((slots[None, :] >= pad) & (slots[None, :] <= slots[:, None])) | \
            (slots[None, :] == slots[:, None])
        out = attend(queries, keys[:, :, :pad + prompt], values[:, :, :pad + prompt],
                     mask[None, None], sinks)
        assert torch.equal(out[0, pad:], trained[row][:prompt])
        # then one query at a time over the whole cache, a mask covering the first slots
        for step in range(prompt, n):
            attended = pad + step + 1 + row  # slots past the last key stay unattended
            valid = (torch.arange(attended) >= pad) & (torch.arange(attended) <= pad + step)
            out = attend(q[None, :, step:step + 1], keys, values, valid[None, None, None], sinks)
            assert torch.equal(out[0, 0], trained[row][step])


def test_the_exact_attention_computes_causal_attention() -> None:
    (q, k, v), = samples([13], seed=2)
    out = attend(q[None], k[None], v[None], None)
    expected = F.scaled_dot_product_attention(q[None], k.repeat_interleave(2, 0)[None],
                                              v.repeat_interleave(2, 0)[None], is_causal=True,
                                              scale=0.2)
    torch.testing.assert_close(out, expected.transpose(1, 2), rtol=1e-5, atol=1e-5)
    additive = torch.zeros(13, 13).masked_fill(~torch.ones(13, 13, dtype=torch.bool).tril(),
                                               torch.finfo(torch.float32).min)
    assert torch.equal(attend(q[None], k[None], v[None], additive[None, None]), out)


def test_attention_sinks_compute_gpt_oss_attention_and_get_its_gradient() -> None:
    """transformers' GPT-OSS eager attention (a sink logit per head joins the softmax, its
    weight dropped), values and gradients (query, key, value and the sinks), over a sliding
    window of 4 keys."""
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    (q, k, v), = samples([13], seed=4)
    q, k, v = (t[None].requires_grad_(True) for t in (q, k, v))
    module = torch.nn.Module()
    module.sinks = torch.nn.Parameter(SINKS.clone())
    module.num_key_value_groups, module.training = HEADS // KV_HEADS, False
    slots = torch.arange(13)
    window = (slots[None, :] <= slots[:, None]) & (slots[None, :] > slots[:, None] - 4)
    upstream = torch.randn(1, 13, HEADS, DIM)
    additive = torch.zeros(13, 13).masked_fill(~window, float("-inf"))[None, None]
    expected = eager_attention_forward(module, q, k, v, additive, scaling=0.2)[0]
    (expected * upstream).sum().backward()
    reference = [t.grad.clone() for t in (q, k, v, module.sinks)]
    for t in (q, k, v, module.sinks):
        t.grad = None
    out = attend(q, k, v, window[None, None], module.sinks)
    (out * upstream).sum().backward()
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    for got, want in zip([t.grad for t in (q, k, v, module.sinks)], reference, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert (attend(q, k, v, window[None, None]) - out).abs().max() > 1e-2  # the sinks count


def test_a_mask_with_holes_is_refused() -> None:
    (q, k, v), = samples([8], seed=3)
    window = torch.ones(8, 8, dtype=torch.bool).tril() & ~torch.ones(8, 8, dtype=torch.bool).tril(-3)
    window[7, 0] = True  # a sink: key 0 plus a window
    with pytest.raises(ExactAttentionError, match="contiguous"):
        attend(q[None], k[None], v[None], window[None, None])


def test_the_gradient_is_the_exact_maths_and_keeps_no_windows_for_backward() -> None:
    """The backward recomputes the attention (SDPA, ordinary kernels) from the inputs alone:
    the gradients are those of the exact math differentiated operation by operation, and
    autograd keeps only the inputs (differentiating the exact math kept every query's window
    of keys: 4 GiB a layer for a packed row of 2048 tokens of a tiny model, an OOM on CPU)."""
    from graft_exact import exact_kernels
    from graft_exact.attention import cpu_window_attention

    parts = samples([5, 40, 9], seed=3)
    q = torch.cat([p[0] for p in parts], dim=1)[None].requires_grad_(True)
    k = torch.cat([p[1] for p in parts], dim=1)[None].requires_grad_(True)
    v = torch.cat([p[2] for p in parts], dim=1)[None].requires_grad_(True)
    segment = torch.cat([torch.full((p[0].shape[1],), i) for i, p in enumerate(parts)])
    slots = torch.arange(len(segment))
    mask = ((segment[:, None] == segment[None, :]) & (slots[None, :] <= slots[:, None]))[None, None]
    upstream = torch.randn(1, len(segment), HEADS, DIM)
    saved: list[int] = []

    def keep(tensor: torch.Tensor) -> torch.Tensor:
        saved.append(tensor.numel() * tensor.element_size())
        return tensor

    with exact_kernels(), torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        out = attend(q, k, v, mask)
    inputs = sum(t.numel() * t.element_size() for t in (q, k, v, mask))
    assert sum(saved) <= inputs
    with exact_kernels():
        (out * upstream).sum().backward()
    ours = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    (cpu_window_attention(q, k, v, mask, scale=0.2) * upstream).sum().backward()
    for got, expected in zip(ours, (q.grad, k.grad, v.grad), strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
