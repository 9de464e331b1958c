"""Matrix products whose rows do not depend on how many rows there are.

A BLAS library picks its kernel from the problem's shape: a single row goes through a
matrix-vector kernel, a few rows through a small-matrix one, many through blocked GEMMs whose
thread split changes with ``M``; each sums the ``K`` products in another order, so a token's
logits differed between a decode step (``M`` = the batch) and the trainer's forward (``M`` = the
packed tokens). Here the rows are cut into tiles of `ROW_TILE` rows (the last one padded with
zero rows) and every tile is a product of the same shape ``(ROW_TILE, K) x (K, N)`` (one batched
call over the tiles, ``b`` broadcast): the library then runs the same kernel on every tile
whatever ``M``, and a row's result depends only on that row (``tests/core/engine/exact`` checks
it at every position of a tile, against other rows, for the shapes of the tiny presets and a
4096 x 4096 one, on 1 to 3 threads). There are at least as many tiles as torch has threads: with
fewer, MKL's batched product splits a tile's own product over the threads, in another order
(measured with torch 2.13 on 2 cores: rows of 1 tile differed from the same rows among 5 tiles
on 2 threads, rows of 2 tiles from the same among 11 on 6 threads).

On CUDA the product is `graft_exact.triton_matmul`'s kernel instead: one tile
configuration, ``K`` summed in fixed chunks added in order (never a split chosen by ``M``).
"""

from __future__ import annotations

import torch

# Rows per BLAS call on CPU. Any fixed value is exact; 64 keeps a decode step's batch in one
# or two calls and a training micro-batch's calls few.
ROW_TILE = 64


def exact_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` for 2-D ``a (M, K)`` and ``b (K, N)``, each row of the result independent of
    ``M`` and of the other rows."""
    if a.is_cuda:
        from graft_exact.triton_matmul import invariant_mm

        return invariant_mm(a, b)
    return _tiled_mm(a, b)


def _tiled_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """One ``bmm`` over the row tiles against ``b`` broadcast to every tile (a single call:
    a Python loop of ``mm`` calls paid OpenMP's start-up per tile), zero tiles added up to one
    per thread so that each tile's product runs on one thread."""
    rows, inner = a.shape
    padded_rows = max(-(-rows // ROW_TILE), torch.get_num_threads(), 1) * ROW_TILE
    tiles = a.new_zeros((padded_rows, inner))
    tiles[:rows] = a
    if not (b.is_contiguous() or b.t().is_contiguous()):
        b = b.contiguous()
    count = padded_rows // ROW_TILE
    out = torch.bmm(tiles.view(count, ROW_TILE, inner), b.expand(count, *b.shape))
    return out.view(padded_rows, b.shape[1])[:rows]


def exact_addmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta: float = 1.0,
                alpha: float = 1.0) -> torch.Tensor:
    """``beta * bias + alpha * (a @ b)`` with `exact_mm`: the product rounded first, then the
    bias added (one rounding point, the same on every path)."""
    product = exact_mm(a, b)
    if alpha != 1:
        product = product * alpha
    return product + (bias if beta == 1 else bias * beta)


def exact_bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` for 3-D ``a (B, M, K)``, ``b (B, K, N)``: `exact_mm` per batch entry (one
    product per element when ``K`` is 1: rotary tables' ``inv_freq @ positions``)."""
    if a.shape[-1] == 1:
        return a * b
    return torch.stack([exact_mm(a[i], b[i]) for i in range(a.shape[0])]) if a.shape[0] else \
        a.new_empty((0, a.shape[1], b.shape[2]))
