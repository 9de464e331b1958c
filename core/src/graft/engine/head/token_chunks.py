"""Shared pieces of the token-chunked autograd functions (`graft.engine.head.chunked`, and
plugins' through `graft.engine`: graft-activation-memory's tiled MLP and recomputed norms): the
chunks, and the parameters' gradients summed over them in fp32."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # tensor methods only: `graft.engine` imports this module without torch
    import torch


def token_chunks(num_tokens: int, chunk_tokens: int) -> list[slice]:
    """Consecutive slices of at most ``chunk_tokens`` covering ``num_tokens`` tokens."""
    return [slice(start, min(start + chunk_tokens, num_tokens))
            for start in range(0, num_tokens, chunk_tokens)]


def add_chunk_grads(totals: list[torch.Tensor | None],
                    grads: Sequence[torch.Tensor | None]) -> None:
    """Add one chunk's parameter gradients into ``totals`` in fp32 (the first chunk's gradient,
    upcast, is the sum's storage): a bf16 sum over many chunks would round each time."""
    for index, grad in enumerate(grads):
        if grad is not None:
            total = totals[index]
            totals[index] = grad.float() if total is None else total.add_(grad)


def cast_like(totals: Sequence[torch.Tensor | None],
              params: Sequence[torch.Tensor]) -> list[torch.Tensor | None]:
    """The summed gradients in their parameters' dtypes."""
    return [None if g is None else g.to(p.dtype) for g, p in zip(totals, params, strict=True)]
