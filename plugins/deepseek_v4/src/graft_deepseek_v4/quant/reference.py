"""The reference quantisers, in plain PyTorch: FP8 E4M3 tiles and FP4 E2M1 groups with
power-of-two scales. The Triton kernels (`graft_deepseek_v4.quant.triton_kernels`) must match
these bit for bit.

The convention is DeepSeek-V4's own (its inference ``kernel.py``: ``act_quant`` with UE8M0 scales
for FP8, ``fp4_quant_kernel`` for FP4; vLLM's DeepSeek-V4 code quantises FP4 with the same
formula, and DeepGEMM's ``per_block_cast_to_fp8`` FP8 weights): a tile's scale is its amax,
floored (``AMAX_FLOOR`` for FP8, ``FP4_AMAX_FLOOR`` for FP4, as DeepSeek's kernels floor them),
divided by the format's largest value and rounded *up* to a power of two (UE8M0), so
``|x| / scale`` never exceeds the largest value: nothing saturates and no clip mask is needed.
This is torchao's ``ScaleCalculationMode.RCEIL`` (NVIDIA's cuBLAS UE8M0 recipe), not the OCP MX
spec's ``FLOOR`` (``2^(floor(log2 amax) - emax)``, which saturates the largest elements). The
rounding is computed exactly from the bits of the amax (no ``log2``), and dividing by a power of
two is a multiplication by its exact inverse, so every step is exact up to the one rounding into
the target format (round to nearest, ties to even).
"""

from __future__ import annotations

import torch

E4M3_MAX = 448.0  # 1.75 * 2**8
E2M1_MAX = 6.0  # 1.5 * 2**2
AMAX_FLOOR = 1e-4  # FP8: DeepSeek's act_quant and DeepGEMM's per_block_cast_to_fp8
FP4_AMAX_FLOOR = 6.0 * 2.0**-126  # FP4: DeepSeek's fp4_quant_kernel (the smallest scale 2^-126)
# qmax -> (its exponent, its mantissa bits, the amax floor)
_FORMATS = {E4M3_MAX: (8, 0x600000, AMAX_FLOOR), E2M1_MAX: (2, 0x400000, FP4_AMAX_FLOOR)}


def pow2_scale(amax: torch.Tensor, qmax: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(scale, 1 / scale)``, fp32: the floored amax (``AMAX_FLOOR`` for FP8, ``FP4_AMAX_FLOOR``
    for FP4) divided by ``qmax`` and rounded up to a power of two.

    With ``amax = m 2^e`` (1 <= m < 2) and ``qmax = c 2^j``: the ratio is ``(m / c) 2^(e - j)``,
    whose power-of-two ceiling is ``2^(e - j)`` when ``m <= c`` and ``2^(e - j + 1)`` otherwise.
    """
    exponent_q, mantissa_q, floor = _FORMATS[qmax]
    bits = amax.float().clamp(min=floor).view(torch.int32)
    exponent = (bits >> 23) - 127
    k = exponent - exponent_q + ((bits & 0x7FFFFF) > mantissa_q).to(torch.int32)
    return ((k + 127) << 23).view(torch.float32), ((127 - k) << 23).view(torch.float32)


def round_to_e2m1(values: torch.Tensor) -> torch.Tensor:
    """Round fp32 ``values`` (|v| <= 6) to the nearest FP4 E2M1 value {0, .5, 1, 1.5, 2, 3, 4, 6},
    ties to even: steps of 0.5 below 2, of 1 below 4, of 2 up to 6."""
    a = values.abs()
    rounded = torch.where(a < 2, torch.round(a * 2) / 2,
                          torch.where(a < 4, torch.round(a), torch.round(a / 2) * 2))
    return rounded.copysign(values)


def check_input(x: torch.Tensor, name: str) -> None:
    """BF16 plain tensors only: FP8/FP4 inference quantises bf16 weights and activations, and a
    DTensor's tiles are not its local shard's."""
    if type(x).__name__ == "DTensor":
        raise TypeError(f"{name}: got a DTensor; pass its local shard (x.to_local()) or the full "
                        f"tensor (x.full_tensor()), whichever holds whole tiles")
    if x.dtype != torch.bfloat16:
        raise TypeError(f"{name}: takes bf16 input (got {x.dtype}); FP8/FP4 inference quantises "
                        f"bf16 tensors, so cast first: x.to(torch.bfloat16)")


def _tile_view(x: torch.Tensor, block: tuple[int, int], name: str) -> torch.Tensor:
    """``x (..., R, C)`` viewed as ``(..., R / br, br, C / bc, bc)`` (``(..., R, 1, C / bc, bc)``
    for one-row tiles); a clear error if it does not tile."""
    rows, cols = block
    if rows < 1 or cols < 1:
        raise ValueError(f"{name}: block {block} must be positive")
    if x.dim() < (2 if rows > 1 else 1):
        raise ValueError(f"{name}: a {rows}x{cols} block needs a tensor of at least "
                         f"{2 if rows > 1 else 1} dims, got shape {tuple(x.shape)}")
    if rows == 1:
        if x.shape[-1] % cols:
            raise ValueError(f"{name}: the last dim of shape {tuple(x.shape)} is not a multiple "
                             f"of the {cols}-wide tiles")
        return x.reshape(*x.shape[:-1], 1, x.shape[-1] // cols, cols)
    if x.shape[-2] % rows or x.shape[-1] % cols:
        raise ValueError(f"{name}: shape {tuple(x.shape)} does not split into {rows}x{cols} "
                         f"tiles (the last two dims must be multiples of {rows} and {cols})")
    return x.reshape(*x.shape[:-2], x.shape[-2] // rows, rows, x.shape[-1] // cols, cols)


def _scales_shape(x: torch.Tensor, block: tuple[int, int]) -> tuple[int, ...]:
    rows, cols = block
    if rows == 1:
        return (*x.shape[:-1], x.shape[-1] // cols)
    return (*x.shape[:-2], x.shape[-2] // rows, x.shape[-1] // cols)


def quantize_fp8(x: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 E4M3 codes of bf16 ``x`` (same shape) and the fp32 scales of its ``block`` tiles over
    the last two dims (``(1, n)``: rows of n along the last dim), leading dims batched."""
    check_input(x, "fp8 quantisation")
    tiles = _tile_view(x, block, "fp8 quantisation").float()
    amax = tiles.abs().amax(dim=(-3, -1), keepdim=True)
    scale, inverse = pow2_scale(amax, E4M3_MAX)
    codes = (tiles * inverse).to(torch.float8_e4m3fn)
    return codes.reshape(x.shape), scale.reshape(_scales_shape(x, block))


def dequantize(codes: torch.Tensor, scales: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """bf16 values of ``codes`` (FP8, or FP4 values held as floats) times their tile's scale;
    exact: a code times a power of two fits bf16."""
    tiles = _tile_view(codes, block, "dequantisation").float()
    rows, cols = block
    if rows == 1:
        expanded = scales.reshape(*scales.shape[:-1], 1, scales.shape[-1], 1)
    else:
        expanded = scales.reshape(*scales.shape[:-2], scales.shape[-2], 1, scales.shape[-1], 1)
    return (tiles * expanded).reshape(codes.shape).to(torch.bfloat16)


def fake_quant_fp8(x: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise bf16 ``x`` to FP8 E4M3 in ``block`` tiles and back: ``(bf16 values, scales)``."""
    codes, scales = quantize_fp8(x, block)
    return dequantize(codes, scales, block), scales


def quantize_fp4(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """FP4 E2M1 values of bf16 ``x`` (as fp32, same shape) and the fp32 scales of its groups of
    ``group`` along the last dim."""
    check_input(x, "fp4 quantisation")
    tiles = _tile_view(x, (1, group), "fp4 quantisation").float()
    scale, inverse = pow2_scale(tiles.abs().amax(dim=-1, keepdim=True), E2M1_MAX)
    values = round_to_e2m1(tiles * inverse)
    return values.reshape(x.shape), scale.reshape(_scales_shape(x, (1, group)))


def fake_quant_fp4(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise bf16 ``x`` to FP4 E2M1 in groups of ``group`` along the last dim and back:
    ``(bf16 values, scales)``."""
    values, scales = quantize_fp4(x, group)
    return dequantize(values, scales, (1, group)), scales
