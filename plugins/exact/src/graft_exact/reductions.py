"""Reductions and activations whose result for a row depends only on that row's values.

``torch.sum`` and friends pick their reduction order from the shape, the strides and the number
of outputs (a single long row may be split over threads; on CUDA a few rows are split over
blocks), so one row's sum can round differently in a batch of 1 and a batch of 100. Here every
reduction over a row is a fixed pairwise tree: the row is padded with zeros to the next power of
two and halved, adding element ``i`` to element ``i + width / 2``, until one element is left.
Only elementwise IEEE additions run, and their rounding does not depend on where a value sits in
memory. Padding a row to a larger power of two adds only exact zeros (the first halvings add
``x + 0 = x``), so the result is also the same whatever the padded width: a row of ``n`` keys
attended in a window of 32 or of 4096 sums to the same bits (`graft_exact.attention`).
On CUDA a row is one Triton program instead (`graft_exact.triton_reductions`: fixed
blocks in order into fixed lanes, then a fixed tree), with the same two properties.

SiLU and the sigmoid are written with ``exp`` because ATen's CPU kernels for them compute the
tail of a tensor that does not fill a vector register with the scalar formula, which rounds
differently (a token's activations then depended on the token's position in the batch);
``exp``, ``log``, ``sin``, ``cos`` and ``rsqrt`` are vectorised to the last element (checked by
``tests/core/engine/exact``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def tree_sum(x: torch.Tensor, dim: int | Sequence[int] | None = -1,
             keepdim: bool = False, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``x.sum(dim)`` as a pairwise tree over the zero-padded power-of-two width (fp32
    accumulation for 16-bit inputs, the result in ``dtype`` or ``x``'s dtype)."""
    out_dtype = dtype or x.dtype
    dims = _dims(x, dim)
    work = x.to(_accumulation_dtype(out_dtype))
    moved = work.movedim(dims, tuple(range(work.dim() - len(dims), work.dim())))
    kept_shape = moved.shape[:moved.dim() - len(dims)]
    flat = moved.reshape(*kept_shape, -1)
    total = _halve(flat)
    if keepdim:
        shape = [1 if i in dims else size for i, size in enumerate(x.shape)]
        total = total.reshape(shape)
    return total.to(out_dtype)


def tree_mean(x: torch.Tensor, dim: int | Sequence[int] | None = -1,
              keepdim: bool = False, dtype: torch.dtype | None = None) -> torch.Tensor:
    """`tree_sum` divided by the number of elements reduced."""
    out_dtype = dtype or x.dtype
    count = 1
    for d in _dims(x, dim):
        count *= x.shape[d]
    total = tree_sum(x, dim, keepdim, dtype=_accumulation_dtype(out_dtype))
    return (total / count).to(out_dtype)


def _dims(x: torch.Tensor, dim: int | Sequence[int] | None) -> tuple[int, ...]:
    if dim is None or (isinstance(dim, Sequence) and len(dim) == 0):
        return tuple(range(x.dim()))
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    return tuple(sorted(d % max(x.dim(), 1) for d in dims))


def _halve(x: torch.Tensor) -> torch.Tensor:
    """Sum over the last dimension by halving (zero-padded to a power of two)."""
    n = x.shape[-1]
    if n == 0:
        return x.new_zeros(x.shape[:-1])
    if x.is_cuda and x.dtype == torch.float32:  # one Triton program per row, never split
        from graft_exact.triton_reductions import row_sum

        return row_sum(x)
    width = 1 << (n - 1).bit_length()
    if width != n:
        x = torch.nn.functional.pad(x, (0, width - n))
    while x.shape[-1] > 1:
        half = x.shape[-1] // 2
        x = x[..., :half] + x[..., half:]
    return x[..., 0]


def _shifted(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x - max, max)`` over ``dim`` in fp32 (a row of -inf keeps max 0: no NaN)."""
    work = x.to(_accumulation_dtype(x.dtype))
    top = work.amax(dim, keepdim=True)  # a max is exact in any order
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    return work - top, top


def exact_softmax(x: torch.Tensor, dim: int = -1, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``softmax(x, dim)``: ``exp(x - max) / tree_sum(exp(x - max))``, in fp32 for 16-bit
    inputs, returned in ``dtype`` (default ``x``'s)."""
    shifted, _ = _shifted(x, dim)
    exp = shifted.exp()
    return (exp / tree_sum(exp, dim, keepdim=True)).to(dtype or x.dtype)


def exact_log_softmax(x: torch.Tensor, dim: int = -1,
                      dtype: torch.dtype | None = None) -> torch.Tensor:
    """``log_softmax(x, dim)``: ``(x - max) - log(tree_sum(exp(x - max)))``."""
    shifted, _ = _shifted(x, dim)
    return (shifted - tree_sum(shifted.exp(), dim, keepdim=True).log()).to(dtype or x.dtype)


def exact_logsumexp(x: torch.Tensor, dim: int | Sequence[int] = -1,
                    keepdim: bool = False) -> torch.Tensor:
    """``logsumexp(x, dim)``: ``log(tree_sum(exp(x - max))) + max`` (fp32 for 16-bit inputs,
    returned in ``x``'s dtype)."""
    dims = _dims(x, dim)
    kept = [1 if i in dims else size for i, size in enumerate(x.shape)]
    moved = x.movedim(dims, tuple(range(x.dim() - len(dims), x.dim())))
    flat = moved.reshape(*moved.shape[:moved.dim() - len(dims)], -1)
    shifted, top = _shifted(flat, -1)
    out = (tree_sum(shifted.exp(), -1, keepdim=True).log() + top).squeeze(-1)
    return (out.reshape(kept) if keepdim else out).to(x.dtype)


def exact_silu(x: torch.Tensor) -> torch.Tensor:
    """``x * sigmoid(x)`` as ``x / (1 + exp(-x))`` (fp32 for 16-bit inputs; one Triton kernel
    on CUDA, `graft_exact.triton_activations`)."""
    if x.is_cuda:
        from graft_exact.triton_activations import logistic

        return logistic(x, times_x=True)
    work = x.to(_accumulation_dtype(x.dtype))
    return (work / (1.0 + torch.exp(-work))).to(x.dtype)


def exact_sigmoid(x: torch.Tensor) -> torch.Tensor:
    """``1 / (1 + exp(-x))`` (fp32 for 16-bit inputs; one Triton kernel on CUDA)."""
    if x.is_cuda:
        from graft_exact.triton_activations import logistic

        return logistic(x, times_x=False)
    work = x.to(_accumulation_dtype(x.dtype))
    return (1.0 / (1.0 + torch.exp(-work))).to(x.dtype)
