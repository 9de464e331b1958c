"""The chunked head with the loss's gradient taken in its forward (a fused linear + loss).

`graft.engine.head.chunked` keeps no logits: its backward recomputes each chunk's logits from the
saved hidden states, one more ``tokens x hidden x vocab`` matmul per step (its share of a long
sequence's step: see bench/README.md). When the loss is token-separable and its aggregation linear
(`graft.losses.contract`), a token's loss gradient is known as soon as its log-prob is: here
each chunk's logits give the log-probs, the loss of the chunk's tokens (``token_loss``), its
gradient with respect to those log-probs, the logits' gradient (the same formulas as the chunked
head's backward) and, through the head, the gradients of the hidden states and of the head's
parameters, all before the chunk's logits are freed. Backward only hands them on, scaled by
the incoming gradient. Liger-Kernel's fused linear cross-entropy does the same for a mean NLL.

Forward returns the log-probs and entropy (fp32, values equal to the chunked head's; no
gradient flows through them) and the summed chunk loss (fp32), whose backward delivers the
gradients.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from graft.engine.head.chunked import Head, _chunk_forward, _chunk_grad, head_arguments
from graft.engine.head.grads import chunk_head_grads, linear_head_weight
from graft.engine.head.token_chunks import cast_like, token_chunks

# token_loss(tokens, logp): the loss of the flat token positions ``tokens`` (a slice) given
# their fp32 log-probs ``logp`` (which require grad), as a scalar, already weighted by the
# aggregation; the sum over all chunks is the micro-batch's loss.
TokenLoss = Callable[[slice, torch.Tensor], torch.Tensor]
# gradient(run): ``run()``, a chunk's gradient computation, in the caller's context and its
# result (the trainer's runs it inside the plugins' graft_compute, step ``gradient``)
GradientRunner = Callable[[Callable[[], Any]], Any]


def _run(run: Callable[[], Any]) -> Any:
    return run()


def _logp_gradient(token_loss: TokenLoss, part: slice, logp: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunk's loss (detached) and its gradient with respect to the chunk's log-probs."""
    with torch.enable_grad():
        leaf = logp.detach().requires_grad_()
        loss = token_loss(part, leaf)
        (grad,) = torch.autograd.grad(loss, leaf, allow_unused=True)
    return loss.detach().float(), torch.zeros_like(leaf) if grad is None else grad


class _FusedHeadLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, hidden: torch.Tensor,
                labels: torch.Tensor, inv_temperature: torch.Tensor, head: Head,
                chunk_tokens: int, with_entropy: bool, token_loss: TokenLoss,
                gradient: GradientRunner, *params: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        num_tokens = hidden.shape[0]
        logp = torch.empty(num_tokens, dtype=torch.float32, device=hidden.device)
        lse = torch.empty_like(logp)
        entropy = torch.empty(num_tokens if with_entropy else 0, dtype=torch.float32,
                              device=hidden.device)
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        wants_hidden = ctx.needs_input_grad[0]
        grad_hidden = torch.zeros_like(hidden) if wants_hidden else None
        grad_params: list[torch.Tensor | None] = [None] * len(params)
        weight = linear_head_weight(head, params)
        for part in token_chunks(num_tokens, chunk_tokens):
            with torch.enable_grad():
                h = hidden[part].detach().requires_grad_(wants_hidden)
                logits = head(h)
            _chunk_forward(logits.detach(), labels[part], inv_temperature[part], logp[part],
                           lse[part], entropy[part] if with_entropy else None)
            chunk_loss, grad_h = gradient(lambda part=part, logits=logits, h=h: _chunk_gradients(
                token_loss, part, logp, lse, logits, h, labels, inv_temperature, params,
                grad_params, wants_hidden, weight))
            total += chunk_loss
            if wants_hidden:
                grad_hidden[part] = grad_h
            del logits, grad_h
        # kept on ctx, not saved tensors: they are this function's own results, not inputs
        # autograd must check for in-place changes
        ctx.grad_hidden, ctx.grad_params = grad_hidden, cast_like(grad_params, params)
        ctx.mark_non_differentiable(logp, entropy)
        return logp, entropy, total

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, _grad_logp: torch.Tensor | None,
                 _grad_entropy: torch.Tensor | None, grad_total: torch.Tensor
                 ) -> tuple[torch.Tensor | None, ...]:
        grads = [ctx.grad_hidden, *ctx.grad_params]
        ctx.grad_hidden, ctx.grad_params = None, []  # a graph is backpropagated once
        # in place (no second copy of the head's gradient): a scale of 1.0, the usual
        # backward, leaves every bit as it is
        hidden_out, *params_out = [None if g is None else g.mul_(grad_total.to(g.dtype))
                                   for g in grads]
        return (hidden_out, None, None, None, None, None, None, None, *params_out)


def _chunk_gradients(token_loss: TokenLoss, part: slice, logp: torch.Tensor, lse: torch.Tensor,
                     logits: torch.Tensor, h: torch.Tensor, labels: torch.Tensor,
                     inv_temperature: torch.Tensor, params: tuple[torch.Tensor, ...],
                     grad_params: list[torch.Tensor | None], wants_hidden: bool,
                     weight: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One chunk's loss and the gradient of its hidden states (its head's parameters' added to
    ``grad_params``), from its logits' log-probs and normalisers."""
    chunk_loss, grad_logp = _logp_gradient(token_loss, part, logp[part])
    grad_logits = _chunk_grad(logits.detach(), labels[part], inv_temperature[part], lse[part],
                              None, grad_logp, None)
    return chunk_loss, chunk_head_grads(logits, h, grad_logits, params, grad_params,
                                        wants_hidden=wants_hidden, weight=weight)


def fused_head_loss(head: torch.nn.Module | Head, hidden: torch.Tensor, labels: torch.Tensor,
                    temperature: torch.Tensor | None, token_loss: TokenLoss, *,
                    chunk_tokens: int, with_entropy: bool = False,
                    params: list[torch.Tensor] | None = None,
                    gradient: GradientRunner | None = None,
                    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Log-probs (fp32, shape of ``labels``), the entropy (or None) and the summed loss of
    ``token_loss`` over all tokens, ``chunk_tokens`` tokens at a time, the loss's gradients
    through the head taken in this forward.

    Arguments as `graft.engine.head.chunked.chunked_head_logprobs`'s; ``token_loss`` is called
    once per chunk with the chunk's flat token slice (over ``labels.reshape(-1)``) and log-probs.
    The log-probs and entropy are detached (the loss carries every gradient); their values are
    the chunked head's bit for bit. ``gradient`` (a `GradientRunner`) runs each chunk's gradient
    computation; None runs it as it is.
    """
    shape = labels.shape
    flat, inv_temperature, params = head_arguments(head, hidden, temperature, chunk_tokens, params)
    logp, entropy, total = _FusedHeadLoss.apply(flat, labels.reshape(-1), inv_temperature, head,
                                                chunk_tokens, with_entropy, token_loss,
                                                gradient or _run, *params)
    return logp.reshape(shape), entropy.reshape(shape) if with_entropy else None, total
