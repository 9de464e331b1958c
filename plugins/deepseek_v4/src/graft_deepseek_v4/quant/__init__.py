"""FP8 block-wise and FP4 group-wise quantisers (quantise, then dequantise to bf16).

Public helpers for checking the quantiser: `fp8_blockwise` and `fp4_groupwise` (the PyTorch
reference; the Triton kernels the GPU path uses equal it bit for bit, see
``bench/gpu/qat_check.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["fp4_groupwise", "fp8_blockwise"]


def fp8_blockwise(x: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Fake-quantise bf16 ``x`` to FP8 E4M3 in ``block`` tiles: ``(dequantised bf16, scales)``.

    ``block`` is ``(rows, cols)`` over the last two dims (``(128, 128)`` for weights, stacked
    ``(E, out, in)`` expert tensors tiled per expert) or ``(1, n)`` along the last dim
    (``(1, 128)`` for activations). Scales are fp32 powers of two, one per tile, shaped like
    the grid of tiles. Raises TypeError for a non-bf16 input and ValueError when the shape does
    not split into whole tiles.
    """
    from graft_deepseek_v4.quant.reference import fake_quant_fp8

    return fake_quant_fp8(x, tuple(block))


def fp4_groupwise(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Fake-quantise bf16 ``x`` to FP4 E2M1 in groups of ``group`` (32 for DeepSeek-V4's experts)
    along the last dim: ``(dequantised bf16, scales)``, scales fp32 powers of two ``(..., C /
    group)``. Same errors as `fp8_blockwise`."""
    from graft_deepseek_v4.quant.reference import fake_quant_fp4

    return fake_quant_fp4(x, group)
