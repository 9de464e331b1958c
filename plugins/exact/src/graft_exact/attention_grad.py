"""`invariant_attention`: the exact attention's forward with the ordinary attention's gradient.

Only the forward has to be batch-invariant; differentiating the exact forward's own operations
would keep every query's window of keys for backward (on CPU, ``queries x window x head dim``
fp32 per layer: 4 GiB for a packed row of 2048 tokens of a tiny model), so the backward
recomputes the same attention with SDPA (with attention sinks, the eager formula) and
differentiates that.
"""

from __future__ import annotations

from typing import Any

import torch

from graft_exact.mode import ordinary_kernels


def invariant_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        mask: torch.Tensor | None, *, scale: float,
                        sinks: torch.Tensor | None = None) -> torch.Tensor:
    """``(B, Q, H, Dv)`` in the query's dtype: query ``(B, H, Q, D)``, key/value
    ``(B, Hkv, K, D)``, a boolean or additive ``(B|1, 1, Q, K')`` mask (or None: causal),
    ``sinks`` ``(H,)`` each head's sink logit (or None). Differentiable in the query, key,
    value and sinks: the gradient is the ordinary attention's (`WindowAttention`)."""
    return WindowAttention.apply(query, key, value, mask, scale, sinks)


class WindowAttention(torch.autograd.Function):
    """The exact forward (the Triton kernel on CUDA, `graft_exact.attention`'s eager
    windows on CPU) with the ordinary attention's gradient.

    Only the forward has to be batch-invariant (it computes the logits the rollout samples
    from and the trainer's log-probs); the backward recomputes the same attention with SDPA
    outside the exact kernels (`ordinary_kernels`) and differentiates that. A query that
    attends no key gets output 0 in the forward, a constant, so its gradient is 0: its rows
    are dropped from the recomputation's incoming gradient.
    """

    @staticmethod
    def forward(ctx: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                mask: torch.Tensor | None, scale: float,
                sinks: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(query, key, value, mask, sinks)
        ctx.scale = scale
        if query.is_cuda:
            from graft_exact.triton_attention import triton_window_attention

            return triton_window_attention(query, key, value, mask, scale=scale, sinks=sinks)
        from graft_exact.attention import cpu_window_attention

        return cpu_window_attention(query, key, value, mask, scale=scale, sinks=sinks)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        query, key, value, mask, sinks = ctx.saved_tensors
        needs = (*ctx.needs_input_grad[:3], ctx.needs_input_grad[5])
        inputs = [None if t is None else t.detach().requires_grad_(wanted)
                  for t, wanted in zip((query, key, value, sinks), needs, strict=True)]
        with torch.enable_grad(), ordinary_kernels():
            out, attends = _reference_attention(*inputs[:3], mask, scale=ctx.scale,
                                                sinks=inputs[3])
            grad_out = grad_out.masked_fill(~attends.transpose(1, 2)[..., None], 0.0)
            wanted = [t for t in inputs if t is not None and t.requires_grad]
            grads = iter(torch.autograd.grad(out, wanted, grad_out))
        query_grad, key_grad, value_grad, sinks_grad = (
            next(grads) if t is not None and t.requires_grad else None for t in inputs)
        return query_grad, key_grad, value_grad, None, None, sinks_grad


def _reference_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         mask: torch.Tensor | None, *, scale: float,
                         sinks: torch.Tensor | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """SDPA (with ``sinks``: `_attention_with_sinks`) over the same keys as the exact forward,
    ``(B, Q, H, Dv)``, and which ``(B, 1, Q)`` queries attend any key (the others attend every
    key here, to stay finite)."""
    batch, heads, queries, _ = query.shape
    keys = key.shape[2] if mask is None else mask.shape[-1]
    if mask is None:
        slots = torch.arange(keys, device=query.device)
        attend = slots[None, :] <= torch.arange(queries, device=query.device)[:, None] + \
            (keys - queries)
        attend = attend[None, None]
    else:
        attend = mask if mask.dtype == torch.bool else mask == 0
    attend = attend.expand(batch, 1, queries, keys)
    attends = attend.any(-1)
    attend = attend | ~attends[..., None]
    group = heads // key.shape[1]
    key = key[:, :, :keys].repeat_interleave(group, 1)
    value = value[:, :, :keys].repeat_interleave(group, 1)
    if sinks is not None:
        return _attention_with_sinks(query, key, value, attend, sinks, scale).transpose(1, 2), \
            attends
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attend,
                                                           scale=scale)
    return out.transpose(1, 2), attends


def _attention_with_sinks(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          attend: torch.Tensor, sinks: torch.Tensor,
                          scale: float) -> torch.Tensor:
    """``(B, H, Q, Dv)``: softmax over the attended keys' scores and each head's sink logit,
    the sink's weight dropped (GPT-OSS's attention; SDPA has no sink). Keys and values have
    one head per query head."""
    scores = (query.float() @ key.float().transpose(-1, -2)) * scale
    scores = scores.masked_fill(~attend, float("-inf"))
    sink = sinks.float().reshape(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
    probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    return (probs @ value.float()).to(query.dtype)
