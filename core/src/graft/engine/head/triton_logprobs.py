"""The log-prob of a label and its gradient on CUDA, as two Triton kernels over ``(tokens, vocab)``
logits (any float dtype, read once per kernel, never upcast in memory).

``forward``: one program per token walks its row in blocks of `BLOCK` logits with an online
``logsumexp`` (the running maximum and the sum of ``exp`` below it, in fp32) and picks the
label's logit: ``logp = logits[label] / T - lse`` and ``lse``. ``backward``: one program per
(token, block of the vocabulary) writes ``(onehot - exp(logits / T - lse)) * grad / T`` in the
logits' dtype: `graft.engine.head.logprobs`' formulas, element by element.

What `torch.compile` generated for the same math (dynamic shapes) ran well below the memory's
bandwidth; these kernels' times against it are in bench/README.md (bench/gpu/head_profile.py).
Runs on CPU tensors under ``TRITON_INTERPRET=1`` (tests).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 4096  # logits per step of a row (forward) or per program (backward)
NUM_WARPS = 8


@triton.jit
def _forward_kernel(logits_ptr, labels_ptr, inv_t_ptr, logp_ptr, lse_ptr, vocab, stride_row,
                    BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * stride_row
    inv_t = tl.load(inv_t_ptr + row)
    cols = tl.arange(0, BLOCK)
    top = float("-inf")
    total = 0.0
    for start in range(0, vocab, BLOCK):
        x = tl.load(base + start + cols, mask=start + cols < vocab,
                    other=float("-inf")).to(tl.float32) * inv_t
        new_top = tl.maximum(top, tl.max(x, axis=0))
        total = total * tl.exp(top - new_top) + tl.sum(tl.exp(x - new_top), axis=0)
        top = new_top
    lse = top + tl.log(total)
    label = tl.load(labels_ptr + row)
    # a label outside the vocabulary reads nothing and gives NaN (a gather would raise)
    picked = tl.load(base + label, mask=(label >= 0) & (label < vocab),
                     other=float("nan")).to(tl.float32) * inv_t
    tl.store(logp_ptr + row, picked - lse)
    tl.store(lse_ptr + row, lse)


@triton.jit
def _backward_kernel(logits_ptr, labels_ptr, inv_t_ptr, lse_ptr, grad_ptr, out_ptr, vocab,
                     stride_row, stride_out, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = cols < vocab
    inv_t = tl.load(inv_t_ptr + row)
    x = tl.load(logits_ptr + row * stride_row + cols, mask=inside, other=0.0).to(tl.float32)
    probs = tl.exp(x * inv_t - tl.load(lse_ptr + row))
    onehot = (cols == tl.load(labels_ptr + row)).to(tl.float32)
    scale = tl.load(grad_ptr + row) * inv_t
    tl.store(out_ptr + row * stride_out + cols,
             ((onehot - probs) * scale).to(out_ptr.dtype.element_ty), mask=inside)


def _rows(logits: torch.Tensor) -> torch.Tensor:
    return logits if logits.stride(-1) == 1 else logits.contiguous()


def triton_forward(logits: torch.Tensor, labels: torch.Tensor, inv_temperature: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logp, lse)`` (fp32, per token) of ``labels`` under ``logits * inv_temperature``."""
    logits = _rows(logits)
    tokens, vocab = logits.shape
    logp = torch.empty(tokens, dtype=torch.float32, device=logits.device)
    lse = torch.empty_like(logp)
    if tokens:
        _forward_kernel[(tokens,)](logits, labels.contiguous(), inv_temperature.float().contiguous(),
                                   logp, lse, vocab, logits.stride(0), BLOCK=BLOCK,
                                   num_warps=NUM_WARPS)
    return logp, lse


def triton_backward(logits: torch.Tensor, labels: torch.Tensor, inv_temperature: torch.Tensor,
                    lse: torch.Tensor, grad_out: torch.Tensor) -> torch.Tensor:
    """The logits' gradient (in their dtype) from the log-probs' ``grad_out``."""
    logits = _rows(logits)
    tokens, vocab = logits.shape
    out = torch.empty_like(logits)
    if tokens:
        grid = (tokens, triton.cdiv(vocab, BLOCK))
        _backward_kernel[grid](logits, labels.contiguous(), inv_temperature.float().contiguous(),
                               lse.contiguous(), grad_out.float().contiguous(), out, vocab,
                               logits.stride(0), out.stride(0), BLOCK=BLOCK, num_warps=NUM_WARPS)
    return out
