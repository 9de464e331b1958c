"""One chunk's gradients through the LM head, for the chunked heads (`graft.engine.head.chunked`,
`graft.engine.head.fused_loss`).

Any head: ``torch.autograd.grad`` through the chunk's logits, the parameters' gradients then
summed over the chunks in fp32 (`graft.engine.head.token_chunks.add_chunk_grads`): each chunk's
weight gradient is written in 16 bits, upcast and added: per chunk after the first, 5 GiB
of memory traffic at a 128K vocabulary and hidden size 4096 (the 16-bit gradient read, the
fp32 sum read and written), 38 GiB over 32K tokens in 4096-token chunks.

A plain bias-free ``nn.Linear`` head in 16 bits on CUDA (the usual ``lm_head``, tied or not;
`linear_head_weight`): the two products directly, the weight's gradient accumulated by the GEMM
itself into its fp32 sum (``addmm`` with an fp32 output): no 16-bit copy per chunk, and no
rounding of a chunk's gradient to 16 bits before the sum.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from graft.engine.head.token_chunks import add_chunk_grads

HALF_DTYPES = (torch.bfloat16, torch.float16)


def linear_head_weight(head: torch.nn.Module | Callable[[torch.Tensor], torch.Tensor],
                       params: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """``head.weight`` when ``head`` is exactly a bias-free ``torch.nn.Linear`` without hooks,
    whose weight, a plain tensor, is the only trainable parameter in ``params``: its chunk
    gradients can be the two products of `chunk_head_grads` (which takes them on CUDA in 16
    bits). Else None (a wrapped, sharded, adapted or hooked head goes through autograd)."""
    if type(head) is not torch.nn.Linear or head.bias is not None:
        return None
    weight = head.weight
    if len(params) != 1 or params[0] is not weight:
        return None
    if type(weight.data) is not torch.Tensor:  # a DTensor or another subclass
        return None
    from torch.nn.modules import module as nn_module

    hooks = (head._forward_hooks, head._forward_pre_hooks, nn_module._global_forward_hooks,
             nn_module._global_forward_pre_hooks)
    return None if any(hooks) else weight


def _products_apply(weight: torch.Tensor, h: torch.Tensor, grad_logits: torch.Tensor) -> bool:
    return (weight.is_cuda and weight.dtype in HALF_DTYPES
            and h.dtype == grad_logits.dtype == weight.dtype
            and not torch.is_autocast_enabled("cuda"))


def chunk_head_grads(logits: torch.Tensor, h: torch.Tensor, grad_logits: torch.Tensor,
                     params: Sequence[torch.Tensor], totals: list[torch.Tensor | None], *,
                     wants_hidden: bool, weight: torch.Tensor | None) -> torch.Tensor | None:
    """The gradient of one chunk's hidden states ``h`` (None unless ``wants_hidden``), adding
    the chunk's parameter gradients into ``totals`` (fp32 sums, one per ``params``).

    ``logits`` are the chunk's ``head(h)``, computed with grad enabled (``h`` requiring grad
    when ``wants_hidden``), ``grad_logits`` their gradient; ``weight`` is
    `linear_head_weight`'s answer for the head or None: the products without autograd on CUDA
    in 16 bits (outside autocast, whose products would cast their inputs), else autograd."""
    if weight is not None and _products_apply(weight, h, grad_logits):
        grad_h = torch.mm(grad_logits, weight) if wants_hidden else None
        total = totals[0]
        flat = h.detach()
        totals[0] = (torch.mm(grad_logits.t(), flat, out_dtype=torch.float32) if total is None
                     else torch.addmm(total, grad_logits.t(), flat, out_dtype=torch.float32,
                                      out=total))
        return grad_h
    inputs = ([h] if wants_hidden else []) + list(params)
    grads = torch.autograd.grad(logits, inputs, grad_logits, allow_unused=True) if inputs else ()
    grad_h = None
    if wants_hidden:
        grad_h, grads = grads[0], grads[1:]
    add_chunk_grads(totals, grads)
    return grad_h
