"""Log-probabilities and entropy straight from the last hidden states, never holding the logits.

The LM head, the temperature, the log-softmax and the entropy run on ``chunk_tokens`` tokens at a
time, forward and backward: forward keeps per token only the log-prob, the entropy and the
``logsumexp`` (fp32), and backward recomputes each chunk's logits from the saved hidden states,
turns the incoming gradients into the logits' gradient analytically and sends it through the
head (`graft.engine.head.grads`: ``torch.autograd.grad``, or a plain linear head's two
products). The largest tensor alive is one chunk's ``chunk x vocab`` logits (and their
gradient), whatever the sequence length: 16 GiB of bf16 logits at 64K tokens of a 128K
vocabulary become 1 GiB with 4096-token chunks.

The head is whatever module the model applies to its last hidden states (a plain, tied or
adapted ``lm_head``); its trainable parameters are inputs of the autograd function, so their
gradients reach autograd the ordinary way (``backward`` and ``torch.autograd.grad`` alike),
summed over the chunks in fp32.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from graft.engine.head.grads import chunk_head_grads, linear_head_weight
from graft.engine.head.logprobs import _backward_math, _chunks, _forward_math, _fused, fuses, rows_entropy
from graft.engine.head.token_chunks import cast_like, token_chunks

Head = Callable[[torch.Tensor], torch.Tensor]


def _entropy_grad(logits: torch.Tensor, inv_temperature: torch.Tensor, lse: torch.Tensor,
                  entropy: torch.Tensor, grad_entropy: torch.Tensor) -> torch.Tensor:
    """The logits' gradient from the entropy's: ``dH/dz = -p (log p + H) / T``, fp32."""
    log_p = logits.float() * inv_temperature[:, None] - lse[:, None]
    return -(log_p.exp() * (log_p + entropy[:, None])) * (grad_entropy * inv_temperature)[:, None]


def _chunk_forward(logits: torch.Tensor, labels: torch.Tensor, inv_temperature: torch.Tensor,
                   logp: torch.Tensor, lse: torch.Tensor, entropy: torch.Tensor | None) -> None:
    """One chunk's log-probs, ``logsumexp`` and entropy, written into ``logp``, ``lse`` and
    ``entropy``: one fused kernel on CUDA, else (and for the entropy) eagerly on slices of
    `graft.engine.head.logprobs`'s size, so the fp32 temporaries stay small whatever the chunk."""
    fused = fuses(logits)
    if fused:
        logp[:], lse[:] = _fused("forward")(logits, labels, inv_temperature)
    for rows in _chunks(*logits.shape):
        if not fused:
            logp[rows], lse[rows] = _forward_math(logits[rows], labels[rows], inv_temperature[rows])
        if entropy is not None:
            entropy[rows] = rows_entropy(logits[rows], inv_temperature[rows])


def _chunk_grad(logits: torch.Tensor, labels: torch.Tensor, inv_temperature: torch.Tensor,
                lse: torch.Tensor, entropy: torch.Tensor | None, grad_logp: torch.Tensor | None,
                grad_entropy: torch.Tensor | None) -> torch.Tensor:
    """The gradient of one chunk's logits (in their dtype) from the log-probs' and entropy's:
    one fused kernel on CUDA for the log-probs alone, else eagerly on slices of
    `graft.engine.head.logprobs`'s size."""
    if grad_entropy is None and fuses(logits):
        return _fused("backward")(logits, labels, inv_temperature, lse, grad_logp)
    grad_logits = torch.empty_like(logits)
    for rows in _chunks(*logits.shape):
        grad = (torch.zeros(grad_logits[rows].shape, dtype=torch.float32, device=logits.device)
                if grad_logp is None else
                _backward_math(logits[rows], labels[rows], inv_temperature[rows], lse[rows],
                               grad_logp[rows]).float())
        if grad_entropy is not None:
            grad += _entropy_grad(logits[rows], inv_temperature[rows], lse[rows], entropy[rows],
                                  grad_entropy[rows])
        grad_logits[rows] = grad
    return grad_logits


class _ChunkedHeadLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, hidden: torch.Tensor,
                labels: torch.Tensor, inv_temperature: torch.Tensor, head: Head,
                chunk_tokens: int, with_entropy: bool,
                *params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        num_tokens = hidden.shape[0]
        logp = torch.empty(num_tokens, dtype=torch.float32, device=hidden.device)
        lse = torch.empty_like(logp)
        entropy = torch.empty(num_tokens if with_entropy else 0, dtype=torch.float32,
                              device=hidden.device)
        for part in token_chunks(num_tokens, chunk_tokens):
            logits = head(hidden[part])
            _chunk_forward(logits, labels[part], inv_temperature[part], logp[part], lse[part],
                           entropy[part] if with_entropy else None)
            del logits
        ctx.save_for_backward(hidden, labels, inv_temperature, lse, entropy, *params)
        ctx.head, ctx.chunk_tokens = head, chunk_tokens
        ctx.set_materialize_grads(False)
        return logp, entropy

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad_logp: torch.Tensor | None,
                 grad_entropy: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        hidden, labels, inv_temperature, lse, entropy, *params = ctx.saved_tensors
        wants_hidden = ctx.needs_input_grad[0]
        grad_hidden = torch.zeros_like(hidden) if wants_hidden else None
        # summed over the chunks in fp32 (a bf16 sum of 32 chunks would round 32 times); the
        # first chunk's gradient is the sum's storage (no copy of an fp32 parameter's)
        grad_params: list[torch.Tensor | None] = [None] * len(params)
        if entropy.numel() == 0:
            grad_entropy = None
        if grad_logp is None and grad_entropy is None:
            return (grad_hidden, None, None, None, None, None, *[None for _ in params])
        weight = linear_head_weight(ctx.head, params)
        for part in token_chunks(hidden.shape[0], ctx.chunk_tokens):
            with torch.enable_grad():
                h = hidden[part].detach().requires_grad_(wants_hidden)
                logits = ctx.head(h)
            grad_logits = _chunk_grad(
                logits.detach(), labels[part], inv_temperature[part], lse[part],
                None if grad_entropy is None else entropy[part],
                None if grad_logp is None else grad_logp[part],
                None if grad_entropy is None else grad_entropy[part])
            grad_h = chunk_head_grads(logits, h, grad_logits, params, grad_params,
                                      wants_hidden=wants_hidden, weight=weight)
            if wants_hidden:
                grad_hidden[part] = grad_h
            del logits, grad_logits, grad_h
        return (grad_hidden, None, None, None, None, None, *cast_like(grad_params, params))


def head_arguments(head: torch.nn.Module | Head, hidden: torch.Tensor,
                   temperature: torch.Tensor | None, chunk_tokens: int,
                   params: list[torch.Tensor] | None
                   ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """The flat ``(tokens, hidden_size)`` hidden states, the flat inverse temperatures (fp32)
    and the head's trainable parameters (``params``, else ``head.parameters()``) that a
    chunked head's autograd function takes; a chunk size below 1 is a ``ValueError``."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    flat = hidden.reshape(-1, hidden.shape[-1])
    inv_temperature = (torch.ones(flat.shape[0], device=hidden.device) if temperature is None
                       else 1.0 / temperature.float()).reshape(-1)
    if params is None:
        params = [p for p in head.parameters() if p.requires_grad] \
            if isinstance(head, torch.nn.Module) else []
    return flat, inv_temperature, params


def chunked_head_logprobs(head: torch.nn.Module | Head, hidden: torch.Tensor,
                          labels: torch.Tensor, temperature: torch.Tensor | None, *,
                          chunk_tokens: int, with_entropy: bool = False,
                          params: list[torch.Tensor] | None = None,
                          ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob (fp32) of ``labels`` under ``head(hidden) / temperature``, and optionally the
    entropy (fp32, differentiable too), computed ``chunk_tokens`` tokens at a time.

    ``hidden`` is ``(..., hidden_size)``, ``labels`` and ``temperature`` ``(...)``; the results
    have the shape of ``labels``. ``head`` maps ``(n, hidden_size)`` to ``(n, vocab)`` logits;
    its trainable parameters (``head.parameters()``, or ``params`` for a plain function) get
    their gradients. Equal to `graft.engine.head.logprobs.token_logprobs` of the whole logits up to
    rounding (fp32 on CPU: within 1e-6).
    """
    shape = labels.shape
    flat, inv_temperature, params = head_arguments(head, hidden, temperature, chunk_tokens, params)
    if not torch.is_grad_enabled():
        params = []
    logp, entropy = _ChunkedHeadLogProbs.apply(flat, labels.reshape(-1), inv_temperature, head,
                                               chunk_tokens, with_entropy, *params)
    return logp.reshape(shape), entropy.reshape(shape) if with_entropy else None
