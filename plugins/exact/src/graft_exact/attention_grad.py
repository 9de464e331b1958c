"""`invariant_attention`: the exact attention's forward with the ordinary attention's gradient.

Only the forward has to be batch-invariant; differentiating the exact forward's own operations
would keep every query's window of keys for backward (on CPU, ``queries x window x head dim``
fp32 per layer: 4 GiB for a packed row of 2048 tokens of a tiny model), so the backward
recomputes the same attention with SDPA and differentiates that.
"""

from __future__ import annotations

from typing import Any

import torch

from graft_exact.mode import ordinary_kernels


def invariant_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        mask: torch.Tensor | None, *, scale: float) -> torch.Tensor:
    """``(B, Q, H, Dv)`` in the query's dtype: query ``(B, H, Q, D)``, key/value
    ``(B, Hkv, K, D)``, a boolean or additive ``(B|1, 1, Q, K')`` mask (or None: causal).
    Differentiable: the gradient is the ordinary attention's (`WindowAttention`)."""
    return WindowAttention.apply(query, key, value, mask, scale)


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
                mask: torch.Tensor | None, scale: float) -> torch.Tensor:
        ctx.save_for_backward(query, key, value, mask)
        ctx.scale = scale
        if query.is_cuda:
            from graft_exact.triton_attention import triton_window_attention

            return triton_window_attention(query, key, value, mask, scale=scale)
        from graft_exact.attention import cpu_window_attention

        return cpu_window_attention(query, key, value, mask, scale=scale)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        query, key, value, mask = ctx.saved_tensors
        inputs = [t.detach().requires_grad_(needs) for t, needs
                  in zip((query, key, value), ctx.needs_input_grad[:3], strict=True)]
        with torch.enable_grad(), ordinary_kernels():
            out, attends = _reference_attention(*inputs, mask, scale=ctx.scale)
            grad_out = grad_out.masked_fill(~attends.transpose(1, 2)[..., None], 0.0)
            wanted = [t for t in inputs if t.requires_grad]
            grads = iter(torch.autograd.grad(out, wanted, grad_out))
        return (*(next(grads) if t.requires_grad else None for t in inputs), None, None)


def _reference_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         mask: torch.Tensor | None, *, scale: float
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """SDPA over the same keys as the exact forward, ``(B, Q, H, Dv)``, and which
    ``(B, 1, Q)`` queries attend any key (the others attend every key here, to stay finite)."""
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
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attend,
                                                           scale=scale)
    return out.transpose(1, 2), attends


