"""Per-token log-probabilities (and entropy) from logits without materialising fp32 logits.

``logp[t] = logits[t, label[t]] / T[t] - logsumexp(logits[t] / T[t])``, with its gradient
``(onehot - softmax) * grad / T`` computed in backward from the saved logits (bf16 on GPU) and the
saved ``logsumexp``, so no fp32 copy of the ``tokens x vocab`` matrix is kept for backward (a plain
``log_softmax(logits.float())`` keeps two). On CUDA each direction is one Triton kernel
(`graft.engine.head.triton_logprobs`); on CPU they run eagerly, a chunk of tokens at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import torch

# fp32 elements processed at once by the eager path: 64M elements = 256 MiB per chunk.
CHUNK_ELEMENTS = 1 << 26


def _forward_math(logits: torch.Tensor, labels: torch.Tensor,
                  inv_temperature: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scaled = logits.float() * inv_temperature[:, None]
    lse = torch.logsumexp(scaled, dim=-1)
    picked = scaled.gather(1, labels[:, None]).squeeze(1)
    return picked - lse, lse


def _backward_math(logits: torch.Tensor, labels: torch.Tensor, inv_temperature: torch.Tensor,
                   lse: torch.Tensor, grad_out: torch.Tensor) -> torch.Tensor:
    probs = torch.exp(logits.float() * inv_temperature[:, None] - lse[:, None])
    vocab = torch.arange(logits.shape[1], device=logits.device)
    onehot = (vocab[None, :] == labels[:, None]).float()
    return ((onehot - probs) * (grad_out * inv_temperature)[:, None]).to(logits.dtype)


@cache
def _fused(kind: str) -> Callable[..., object]:
    """The CUDA kernel of ``kind`` ("forward" or "backward"), `graft.engine.head.triton_logprobs`'s
    (imported on first use: Triton comes with every CUDA build of torch, not with CPU ones)."""
    from graft.engine.head.triton_logprobs import triton_backward, triton_forward

    return triton_forward if kind == "forward" else triton_backward


def fuses(logits: torch.Tensor) -> bool:
    """Whether the log-probs of ``logits`` take the Triton kernels: on CUDA. Inside a
    plugin's batch-invariant kernels (graft-exact) too: the forward kernel gives each row one
    program walking the vocabulary in fixed blocks in order, so a token's log-prob does not
    depend on the rows around it (the rollout's decode batch, the trainer's chunk)."""
    return logits.is_cuda


def _chunks(num_tokens: int, vocab: int) -> list[slice]:
    size = max(1, CHUNK_ELEMENTS // max(vocab, 1))
    return [slice(start, min(start + size, num_tokens)) for start in range(0, num_tokens, size)]


class _LogProb(torch.autograd.Function):
    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, logits: torch.Tensor,
                labels: torch.Tensor, inv_temperature: torch.Tensor) -> torch.Tensor:
        if fuses(logits):
            out, lse = _fused("forward")(logits, labels, inv_temperature)
        else:
            out = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
            lse = torch.empty_like(out)
            for part in _chunks(*logits.shape):
                out[part], lse[part] = _forward_math(logits[part], labels[part],
                                                     inv_temperature[part])
        ctx.save_for_backward(logits, labels, inv_temperature, lse)
        return out

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx,
                 grad_out: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        logits, labels, inv_temperature, lse = ctx.saved_tensors
        if fuses(logits):
            return _fused("backward")(logits, labels, inv_temperature, lse, grad_out), None, None
        grad_logits = torch.empty_like(logits)
        for part in _chunks(*logits.shape):
            grad_logits[part] = _backward_math(logits[part], labels[part], inv_temperature[part],
                                               lse[part], grad_out[part])
        return grad_logits, None, None


def token_logprobs(logits: torch.Tensor, labels: torch.Tensor,
                   temperature: torch.Tensor | None = None) -> torch.Tensor:
    """Log-probability (fp32) of ``labels`` under ``logits / temperature``.

    ``logits`` is ``(..., vocab)``, ``labels`` and ``temperature`` are ``(...)``; the result has
    the shape of ``labels``. Differentiable with respect to ``logits``.
    """
    shape = labels.shape
    flat_logits = logits.reshape(-1, logits.shape[-1])
    inv_temperature = (torch.ones(shape, device=logits.device) if temperature is None
                       else 1.0 / temperature.float()).reshape(-1)
    return _LogProb.apply(flat_logits, labels.reshape(-1), inv_temperature).reshape(shape)


@torch.no_grad()
def token_entropy(logits: torch.Tensor, temperature: torch.Tensor | None = None) -> torch.Tensor:
    """Entropy (fp32, no gradient) of the distribution at every position, chunked."""
    flat = logits.reshape(-1, logits.shape[-1])
    inv_temperature = (torch.ones(flat.shape[0], device=logits.device) if temperature is None
                       else 1.0 / temperature.float().reshape(-1))
    out = torch.empty(flat.shape[0], dtype=torch.float32, device=logits.device)
    for part in _chunks(*flat.shape):
        out[part] = rows_entropy(flat[part], inv_temperature[part])
    return out.reshape(logits.shape[:-1])


def rows_entropy(logits: torch.Tensor, inv_temperature: torch.Tensor) -> torch.Tensor:
    """Entropy (fp32) of ``softmax(logits * inv_temperature)`` for each row of 2-D ``logits``:
    the one formula of the whole-logits and the chunked (`graft.engine.head.chunked`) paths."""
    logp = torch.log_softmax(logits.float() * inv_temperature[:, None], dim=-1)
    return -(logp.exp() * logp).sum(-1)
