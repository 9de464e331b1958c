"""Fused Triton fake-quant kernels (CUDA): one pass reads bf16, writes the dequantised bf16 (or
the FP8 codes) and the scales. Same contract and same bits as `graft_deepseek_v4.quant.reference`
(checked on the GPU by ``bench/gpu/qat_check.py``): the scale exponent comes from the amax's bits,
division by a power of two is a multiplication, FP8 rounds to nearest even, FP4 rounds to
nearest even on the same three grids.
"""


import torch
import triton
import triton.language as tl

from graft_deepseek_v4.quant.reference import (
    AMAX_FLOOR,
    FP4_AMAX_FLOOR,
    _scales_shape,
    check_input,
)

ROWS_PER_PROGRAM = 32
AMAX_FLOOR_C = tl.constexpr(AMAX_FLOOR)
FP4_AMAX_FLOOR_C = tl.constexpr(FP4_AMAX_FLOOR)


@triton.jit
def _pow2_scale(amax, EXPONENT_Q: tl.constexpr, MANTISSA_Q: tl.constexpr, FLOOR: tl.constexpr):
    bits = tl.maximum(amax, FLOOR).to(tl.int32, bitcast=True)
    k = ((bits >> 23) - 127) - EXPONENT_Q + ((bits & 0x7FFFFF) > MANTISSA_Q).to(tl.int32)
    scale = ((k + 127) << 23).to(tl.float32, bitcast=True)
    inverse = ((127 - k) << 23).to(tl.float32, bitcast=True)
    return scale, inverse


@triton.jit
def _rint(a):
    # round half to even for 0 <= a < 2^22, with floor only: the compiler may fold the
    # (a + 2^23) - 2^23 trick back to a (it did), floor it cannot
    nearest = tl.floor(a + 0.5)
    tie = (nearest - a) == 0.5
    odd = (nearest - 2.0 * tl.floor(nearest * 0.5)) == 1.0
    return tl.where(tie & odd, nearest - 1.0, nearest)


@triton.jit
def _round_e2m1(v):
    a = tl.abs(v)
    r = tl.where(a < 2.0, _rint(a * 2.0) * 0.5, tl.where(a < 4.0, _rint(a), _rint(a * 0.5) * 2.0))
    # v's sign bit on r by bits: -0.0 stays -0.0 (the compiler folded a select of -r to +0.0)
    sign = v.to(tl.int32, bitcast=True) & -2147483648
    return (r.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)


@triton.jit
def _rows_kernel(x_ptr, out_ptr, codes_ptr, scales_ptr, num_rows, width,
                 GROUP: tl.constexpr, FP4: tl.constexpr, WRITE_OUT: tl.constexpr,
                 WRITE_CODES: tl.constexpr, BLOCK_ROWS: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    group = tl.program_id(1)
    cols = group * GROUP + tl.arange(0, GROUP)
    valid = rows < num_rows
    offsets = rows[:, None].to(tl.int64) * width + cols[None, :]
    x = tl.load(x_ptr + offsets, mask=valid[:, None], other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(x), axis=1)
    if FP4:
        scale, inverse = _pow2_scale(amax, 2, 0x400000, FP4_AMAX_FLOOR_C)
        codes = _round_e2m1(x * inverse[:, None])
        values = codes
    else:
        scale, inverse = _pow2_scale(amax, 8, 0x600000, AMAX_FLOOR_C)
        codes = (x * inverse[:, None]).to(tl.float8e4nv, fp_downcast_rounding="rtne")
        values = codes.to(tl.float32)
    if WRITE_OUT:
        tl.store(out_ptr + offsets, (values * scale[:, None]).to(tl.bfloat16), mask=valid[:, None])
    if WRITE_CODES:
        tl.store(codes_ptr + offsets, codes, mask=valid[:, None])
    tl.store(scales_ptr + rows.to(tl.int64) * (width // GROUP) + group, scale, mask=valid)


@triton.jit
def _tiles_kernel(x_ptr, out_ptr, codes_ptr, scales_ptr, num_rows, width,
                  TILE: tl.constexpr, WRITE_OUT: tl.constexpr, WRITE_CODES: tl.constexpr):
    batch = tl.program_id(0)
    tile_row = tl.program_id(1)
    tile_col = tl.program_id(2)
    rows = tile_row * TILE + tl.arange(0, TILE)
    cols = tile_col * TILE + tl.arange(0, TILE)
    offsets = batch.to(tl.int64) * num_rows * width + rows[:, None].to(tl.int64) * width + cols[None, :]
    x = tl.load(x_ptr + offsets).to(tl.float32)
    amax = tl.max(tl.max(tl.abs(x), axis=1), axis=0)
    scale, inverse = _pow2_scale(amax, 8, 0x600000, AMAX_FLOOR_C)
    codes = (x * inverse).to(tl.float8e4nv, fp_downcast_rounding="rtne")
    if WRITE_OUT:
        tl.store(out_ptr + offsets, (codes.to(tl.float32) * scale).to(tl.bfloat16))
    if WRITE_CODES:
        tl.store(codes_ptr + offsets, codes)
    tiles_per_row = width // TILE
    tl.store(scales_ptr + (batch.to(tl.int64) * (num_rows // TILE) + tile_row) * tiles_per_row
             + tile_col, scale)


def _launch(x: torch.Tensor, block: tuple[int, int], *, fp4: bool, write_out: bool,
            write_codes: bool) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
    from graft_deepseek_v4.quant.reference import _tile_view

    _tile_view(x, block, "fp4 quantisation" if fp4 else "fp8 quantisation")  # shape checks
    rows, cols = block
    source = x.contiguous()
    out = torch.empty_like(source) if write_out else None
    code_dtype = torch.float32 if fp4 else torch.float8_e4m3fn
    codes = torch.empty(source.shape, dtype=code_dtype, device=x.device) if write_codes else None
    scales = torch.empty(_scales_shape(x, block), dtype=torch.float32, device=x.device)
    if source.numel() == 0:
        return out, codes, scales
    dummy = scales
    if rows == 1:
        num_rows = source.numel() // source.shape[-1]
        grid = (triton.cdiv(num_rows, ROWS_PER_PROGRAM), source.shape[-1] // cols)
        _rows_kernel[grid](source, out if write_out else dummy, codes if write_codes else dummy,
                           scales, num_rows, source.shape[-1], GROUP=cols, FP4=fp4,
                           WRITE_OUT=write_out, WRITE_CODES=write_codes,
                           BLOCK_ROWS=ROWS_PER_PROGRAM)
    else:
        batch = source.numel() // (source.shape[-2] * source.shape[-1])
        grid = (batch, source.shape[-2] // rows, source.shape[-1] // cols)
        _tiles_kernel[grid](source, out if write_out else dummy, codes if write_codes else dummy,
                            scales, source.shape[-2], source.shape[-1], TILE=rows,
                            WRITE_OUT=write_out, WRITE_CODES=write_codes, num_warps=8)
    return out, codes, scales


def _check_block(block: tuple[int, int]) -> tuple[int, int]:
    rows, cols = block
    if rows not in (1, cols) or cols & (cols - 1) or cols < 16:
        raise ValueError(f"the Triton kernels take (1, n) or (n, n) blocks with n a power of two "
                         f">= 16, got {block}")
    return rows, cols


def fake_quant_fp8(x: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """`graft_deepseek_v4.quant.reference.fake_quant_fp8`, fused."""
    check_input(x, "fp8 quantisation")
    out, _, scales = _launch(x, _check_block(block), fp4=False, write_out=True, write_codes=False)
    return out.view(x.shape), scales


def quantize_fp8(x: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """`graft_deepseek_v4.quant.reference.quantize_fp8`, fused (FP8 codes and scales)."""
    check_input(x, "fp8 quantisation")
    _, codes, scales = _launch(x, _check_block(block), fp4=False, write_out=False,
                               write_codes=True)
    return codes.view(x.shape), scales


def fake_quant_fp4(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`graft_deepseek_v4.quant.reference.fake_quant_fp4`, fused."""
    check_input(x, "fp4 quantisation")
    out, _, scales = _launch(x, _check_block((1, group)), fp4=True, write_out=True,
                             write_codes=False)
    return out.view(x.shape), scales
