"""Recomputed norms (``engine.recompute_norms``): a decoder block's RMSNorm/LayerNorm keeps only
its input for backward and runs again there.

An RMSNorm in bf16 computes in fp32 and keeps its fp32 input and a bf16 copy of the normalised
values for backward: 24 bytes per hidden value, 96 KiB per token at Llama-8B shapes (hidden
4096) for a block's two norms, inside a checkpointed block's backward, against 8 KiB for the
block's input. Recomputed, a norm keeps only its input, which another operation holds anyway
(the block's input, the attention's residual sum, the projection it feeds). The extra cost is
one more norm forward in backward (memory-bound, small next to the block's matmuls). The
forward's values are bit-identical. In backward the norm's own gradient contributions to its
input are summed before they join the residual path's, which in bf16 the norm's fp32 upcast
does anyway (bit-identical), and in fp32 reorders one addition (rounding: tests say 1e-6).

Only in training with gradients and outside ``torch.compile`` (a compiled block fuses its norms
itself), like the tiled MLP (`graft.engine.tiled_mlp`).
"""

from __future__ import annotations

import logging
import types
from collections.abc import Sequence
from typing import Any

import torch

logger = logging.getLogger("graft.engine")

RECOMPUTED_ATTRIBUTE = "_graft_recomputed_norm"
NORM_CLASS_SUFFIXES = ("RMSNorm", "LayerNorm")


class _RecomputedNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, norm: torch.nn.Module,
                x: torch.Tensor, *params: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, *params)
        ctx.norm = norm
        return type(norm).forward(norm, x)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx,
                 grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, *params = ctx.saved_tensors
        with torch.enable_grad():
            inputs = x.detach().requires_grad_()
            out = type(ctx.norm).forward(ctx.norm, inputs)
        grads = torch.autograd.grad(out, [inputs, *params], grad_out, allow_unused=True)
        return (None, *grads)


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


def apply_recomputed_norms(blocks: Sequence[torch.nn.Module]) -> int:
    """Make the norms inside ``blocks`` recompute in backward (``engine.recompute_norms``), in
    place: the module and its parameter names stay, only its instance's ``forward`` is
    replaced. Returns the number of norms."""
    norms = block_norms(blocks)
    for norm in norms:
        setattr(norm, RECOMPUTED_ATTRIBUTE, True)
        norm.forward = types.MethodType(_recomputed_forward, norm)
    logger.debug("%d norms recompute in backward", len(norms))
    return len(norms)
