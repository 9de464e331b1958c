"""Tiled MLP (``features.activation_memory.mlp_chunk_tokens``): a decoder block's dense MLP over
a chunk of tokens at a time, each chunk recomputed in backward.

A checkpointed block's backward recomputes its forward and keeps what the MLP's backward needs:
the gate, up and activated ``tokens x intermediate_size`` matrices (3.5 of them for SwiGLU),
112 KiB per token at Llama-8B shapes against 8 KiB for the block's input. Tiled, the forward keeps
only the MLP's input and each chunk's intermediates exist only while that chunk's backward
runs; the MLP's weight gradients are summed over the chunks in fp32. The extra cost is one more
MLP forward per chunk in backward.

Only in training with gradients (the rollout and no-grad scoring run the MLP whole, unchanged)
and outside ``torch.compile`` (a compiled block runs its MLP whole). MoE MLPs (any module holding
one of the family's routers) stay whole: a router must see every token of the layer in one
call (routing replay records and replays per call).
"""

from __future__ import annotations

import logging
import types
from collections.abc import Sequence
from typing import Any

import torch

from graft.engine import add_chunk_grads, cast_like, token_chunks

logger = logging.getLogger("graft_activation_memory")

TILED_ATTRIBUTE = "_graft_mlp_chunk_tokens"


class _TiledMLP(torch.autograd.Function):
    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, mlp: torch.nn.Module,
                chunk_tokens: int, x: torch.Tensor, *params: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        forward = type(mlp).forward
        out = torch.cat([forward(mlp, flat[part])
                         for part in token_chunks(flat.shape[0], chunk_tokens)])
        ctx.save_for_backward(x, *params)
        ctx.mlp, ctx.chunk_tokens = mlp, chunk_tokens
        return out.reshape(*x.shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx,
                 grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, *params = ctx.saved_tensors
        flat = x.reshape(-1, x.shape[-1])
        grad_flat = grad_out.reshape(-1, grad_out.shape[-1])
        grad_x = torch.empty_like(flat)
        # summed over the chunks in fp32, whatever the parameters' dtype (the first chunk's
        # gradient is the sum's storage)
        grad_params: list[torch.Tensor | None] = [None] * len(params)
        forward = type(ctx.mlp).forward
        for part in token_chunks(flat.shape[0], ctx.chunk_tokens):
            with torch.enable_grad():
                chunk = flat[part].detach().requires_grad_()
                out = forward(ctx.mlp, chunk)
            grads = torch.autograd.grad(out, [chunk, *params], grad_flat[part], allow_unused=True)
            grad_x[part] = grads[0]
            add_chunk_grads(grad_params, grads[1:])
            del out, grads
        return (None, None, grad_x.reshape(x.shape), *cast_like(grad_params, params))


def _tiled_forward(self: torch.nn.Module, x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    """The MLP's forward, tiled in training (see the module docstring)."""
    chunk_tokens = getattr(self, TILED_ATTRIBUTE)
    tile = (torch.is_grad_enabled() and not args and not kwargs
            and not torch.compiler.is_compiling() and x.shape[:-1].numel() > chunk_tokens)
    if not tile:
        return type(self).forward(self, x, *args, **kwargs)
    params = [p for p in self.parameters() if p.requires_grad]
    return _TiledMLP.apply(self, chunk_tokens, x, *params)


def dense_mlps(blocks: Sequence[torch.nn.Module],
               routers: Sequence[torch.nn.Module] = ()) -> list[torch.nn.Module]:
    """Each block's ``mlp`` that holds none of ``routers`` (the family's MoE routers)."""
    router_ids = {id(r) for r in routers}
    found = []
    for block in blocks:
        mlp = getattr(block, "mlp", None)
        if isinstance(mlp, torch.nn.Module) and not any(id(m) in router_ids
                                                        for m in mlp.modules()):
            found.append(mlp)
    return found


def apply_tiled_mlp(blocks: Sequence[torch.nn.Module], chunk_tokens: int,
                    routers: Sequence[torch.nn.Module] = ()) -> int:
    """Tile the dense MLPs of ``blocks`` (``features.activation_memory.mlp_chunk_tokens`` =
    ``chunk_tokens`` > 0) in place: the module and its parameter names stay, only its
    instance's ``forward`` is replaced. Returns the number of MLPs tiled."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    mlps = dense_mlps(blocks, routers)
    for mlp in mlps:
        setattr(mlp, TILED_ATTRIBUTE, chunk_tokens)
        mlp.forward = types.MethodType(_tiled_forward, mlp)
    logger.debug("tiled %d MLPs in chunks of %d tokens", len(mlps), chunk_tokens)
    return len(mlps)
