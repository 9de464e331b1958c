"""Recomputed norms (``features.activation_memory.recompute_norms``): the decoder blocks' and the
final RMSNorm or LayerNorm keep only their input for backward and run again there, on
``NORM_CHUNK_TOKENS`` tokens at a time.

An RMSNorm in bf16 computes in fp32 and keeps its fp32 input and a bf16 copy of the normalised
values for backward: 24 bytes per hidden value, 96 KiB per token at Llama-8B shapes (hidden
4096) for a block's two norms, inside a checkpointed block's backward, against 8 KiB for the
block's input. Recomputed, a norm keeps only its input, which another operation holds anyway
(the block's input, the attention's residual sum, the projection it feeds). The final norm,
outside the blocks' checkpoints, would otherwise keep those fp32 values for the whole sequence
until the head's backward, the step's peak at long context. Both directions run on chunks of
tokens (a norm is per token), so the fp32 temporaries are one chunk's. The extra cost is one
more norm forward in backward (memory-bound, small next to the block's matmuls).

The forward's values are bit-identical. In backward the norm's own gradient contributions to
its input are summed before they join the residual path's, which in bf16 the norm's fp32 upcast
does anyway (bit-identical), and in fp32 reorders one addition (rounding: tests say 1e-6); over
more than one chunk the weight's gradient is a sum of the chunks' (in fp32).

Only in training with gradients and outside ``torch.compile`` (a compiled block fuses its norms
itself), like the tiled MLP (`graft_activation_memory.tiled_mlp`).
"""

from __future__ import annotations

import logging
import types
from collections.abc import Sequence
from typing import Any

import torch

from graft.engine import add_chunk_grads, cast_like, token_chunks

logger = logging.getLogger("graft_activation_memory")

RECOMPUTED_ATTRIBUTE = "_graft_recomputed_norm"
NORM_CLASS_SUFFIXES = ("RMSNorm", "LayerNorm")
# Tokens per chunk: one chunk up to 16K tokens (results bit-identical to the whole norm's);
# an fp32 chunk of hidden 4096 is 256 MiB.
NORM_CHUNK_TOKENS = 16384


def _token_chunks(x: torch.Tensor) -> list[slice]:
    return token_chunks(x.shape[:-1].numel(), NORM_CHUNK_TOKENS)


class _RecomputedNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, norm: torch.nn.Module,
                x: torch.Tensor, *params: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, *params)
        ctx.norm = norm
        forward = type(norm).forward
        parts = _token_chunks(x)
        if len(parts) == 1:
            return forward(norm, x)
        flat = x.reshape(-1, x.shape[-1])
        return torch.cat([forward(norm, flat[part]) for part in parts]).reshape(x.shape)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx,
                 grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, *params = ctx.saved_tensors
        parts = _token_chunks(x)
        if len(parts) == 1:
            return (None, *_norm_grads(ctx.norm, x, params, grad_out))
        flat, grad_flat = x.reshape(-1, x.shape[-1]), grad_out.reshape(-1, x.shape[-1])
        grad_x = torch.empty_like(flat)
        grad_params: list[torch.Tensor | None] = [None] * len(params)
        for part in parts:
            grad_x[part], *grads = _norm_grads(ctx.norm, flat[part], params, grad_flat[part])
            add_chunk_grads(grad_params, grads)
        return (None, grad_x.reshape(x.shape), *cast_like(grad_params, params))


def _norm_grads(norm: torch.nn.Module, x: torch.Tensor, params: Sequence[torch.Tensor],
                grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    """The gradients of ``x`` and ``params`` through ``norm``'s forward, recomputed from ``x``."""
    with torch.enable_grad():
        inputs = x.detach().requires_grad_()
        out = type(norm).forward(norm, inputs)
    return torch.autograd.grad(out, [inputs, *params], grad_out, allow_unused=True)


def _recomputed_forward(self: torch.nn.Module, x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    """The norm's forward, recomputed in backward in training (see the module docstring)."""
    if (args or kwargs or not torch.is_grad_enabled() or torch.compiler.is_compiling()
            or not x.requires_grad):
        return type(self).forward(self, x, *args, **kwargs)
    params = [p for p in self.parameters() if p.requires_grad]
    return _RecomputedNorm.apply(self, x, *params)


def block_norms(blocks: Sequence[torch.nn.Module]) -> list[torch.nn.Module]:
    """The normalisation modules inside ``blocks``: ``torch.nn.LayerNorm``/``RMSNorm`` and any
    module whose class name ends with ``RMSNorm`` or ``LayerNorm`` (transformers' own)."""
    found = []
    for block in blocks:
        for module in block.modules():
            if (isinstance(module, (torch.nn.LayerNorm, torch.nn.RMSNorm))
                    or type(module).__name__.endswith(NORM_CLASS_SUFFIXES)):
                found.append(module)
    return found


def final_norm(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The norm a Hugging Face causal LM applies after its last block (``get_decoder().norm``),
    as a list of zero or one module."""
    get_decoder = getattr(model, "get_decoder", None)
    norm = getattr(get_decoder(), "norm", None) if callable(get_decoder) else None
    return block_norms([norm]) if isinstance(norm, torch.nn.Module) else []


def apply_recomputed_norms(modules: Sequence[torch.nn.Module]) -> int:
    """Make the norms inside ``modules`` (decoder blocks, the final norm) recompute in backward
    (``features.activation_memory.recompute_norms``), in place: the module and its parameter
    names stay, only its instance's ``forward`` is replaced. Returns the number of norms."""
    norms = block_norms(modules)
    for norm in norms:
        setattr(norm, RECOMPUTED_ATTRIBUTE, True)
        norm.forward = types.MethodType(_recomputed_forward, norm)
    logger.debug("%d norms recompute in backward", len(norms))
    return len(norms)
