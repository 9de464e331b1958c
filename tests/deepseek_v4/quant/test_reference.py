"""The PyTorch reference quantisers: round trips, power-of-two scales, tiles and groups, errors."""

from __future__ import annotations

import math

import pytest
import torch

from graft_deepseek_v4.quant import fp4_groupwise, fp8_blockwise
from graft_deepseek_v4.quant.reference import (
    E2M1_MAX,
    E4M3_MAX,
    fake_quant_fp8,
    pow2_scale,
    quantize_fp8,
)


def wide_range(*shape: int, seed: int = 0) -> torch.Tensor:
    """bf16 values spread over ~10 orders of magnitude, so tiles have very different scales."""
    generator = torch.Generator().manual_seed(seed)
    magnitude = torch.exp(torch.empty(shape).uniform_(-12, 10, generator=generator))
    return (torch.randn(shape, generator=generator) * magnitude).bfloat16()


def e4m3_ulp(v: torch.Tensor) -> torch.Tensor:
    """Spacing of E4M3 values at |v| (3 mantissa bits, subnormal spacing 2^-9 below 2^-6)."""
    exponent = torch.floor(torch.log2(v.abs().clamp(min=2.0**-6)))
    return torch.exp2(exponent - 3)


def expand(scales: torch.Tensor, block: tuple[int, int], shape: torch.Size) -> torch.Tensor:
    rows, cols = block
    out = scales.repeat_interleave(cols, dim=-1)
    if rows > 1:
        out = out.repeat_interleave(rows, dim=-2)
    return out.expand(shape)


@pytest.mark.parametrize("block", [(128, 128), (1, 128), (1, 64)])
def test_fp8_round_trip_is_within_half_an_e4m3_ulp(block) -> None:
    x = wide_range(3, 256, 384)
    dequantised, scales = fake_quant_fp8(x, block)
    assert dequantised.dtype == torch.bfloat16 and dequantised.shape == x.shape
    scale = expand(scales, block, x.shape)
    error = (dequantised.float() - x.float()).abs()
    assert torch.all(error <= e4m3_ulp(x.float() / scale) * scale / 2)


@pytest.mark.parametrize("block", [(128, 128), (1, 128)])
def test_scales_are_the_amax_rounded_up_to_a_power_of_two(block) -> None:
    x = wide_range(256, 512, seed=1)
    codes, scales = quantize_fp8(x, block)
    exponent = torch.log2(scales)
    assert torch.equal(exponent, exponent.round()), "powers of two"
    rows, cols = block
    tiles = x.float().reshape(256 // rows, rows, 512 // cols, cols)
    amax = tiles.abs().amax(dim=(1, 3)).reshape(scales.shape).double()
    assert torch.all(amax / scales.double() <= E4M3_MAX), "nothing saturates"
    assert torch.all(amax / scales.double() > E4M3_MAX / 2), "the smallest such power of two"
    assert codes.float().abs().max() <= E4M3_MAX


def test_pow2_scale_is_exact_at_the_boundaries() -> None:
    ks = torch.arange(-12, 20, dtype=torch.float64)
    at = (E4M3_MAX * torch.exp2(ks)).float()  # amax / 448 exactly 2^k
    above = torch.nextafter(at, torch.tensor(math.inf))
    scale_at, inverse_at = pow2_scale(at, E4M3_MAX)
    scale_above, _ = pow2_scale(above, E4M3_MAX)
    assert torch.equal(scale_at.double(), torch.exp2(ks))
    assert torch.equal(scale_above.double(), torch.exp2(ks + 1))
    assert torch.equal(scale_at * inverse_at, torch.ones_like(scale_at))
    tiny, _ = pow2_scale(torch.tensor([0.0, 1e-30]), E4M3_MAX)
    assert torch.equal(tiny, pow2_scale(torch.tensor([1e-4, 1e-4]), E4M3_MAX)[0]), "amax floor"


def test_stacked_experts_are_tiled_per_expert() -> None:
    experts = wide_range(4, 256, 128, seed=2)
    together, scales = fp8_blockwise(experts, (128, 128))
    assert scales.shape == (4, 2, 1)
    for index in range(4):
        alone, alone_scales = fp8_blockwise(experts[index], (128, 128))
        assert torch.equal(together[index], alone) and torch.equal(scales[index], alone_scales)


def test_fp8_rounds_ties_to_even() -> None:
    x = torch.zeros(1, 128)
    x[0, :4] = torch.tensor([448.0, 17.0, 19.0, 21.0])  # scale 1; E4M3 steps by 2 in [16, 32)
    dequantised, scales = fp8_blockwise(x.bfloat16(), (1, 128))
    assert scales.item() == 1.0
    assert dequantised[0, :4].tolist() == [448.0, 16.0, 20.0, 20.0]


def test_fp4_groups_of_32_on_the_e2m1_grid() -> None:
    x = wide_range(4, 8, 256, seed=3)
    dequantised, scales = fp4_groupwise(x, 32)
    assert scales.shape == (4, 8, 8)
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    values = dequantised.float() / expand(scales, (1, 32), x.shape)
    assert torch.isin(values.abs(), grid).all()
    groups = x.float().reshape(4, 8, 8, 32).abs().amax(-1)
    assert torch.all(groups / scales <= E2M1_MAX) and torch.all(groups / scales > E2M1_MAX / 2)
    changed = x.clone()
    changed[0, 0, 40] = 1e9  # one element of group 1 of row (0, 0)
    _, changed_scales = fp4_groupwise(changed, 32)
    differs = (changed_scales != scales).nonzero().tolist()
    assert differs == [[0, 0, 1]], "only its own group's scale moves"


def test_fp4_rounds_ties_to_even() -> None:
    x = torch.zeros(1, 32)
    x[0, :8] = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, -5.0])  # scale 1
    dequantised, scales = fp4_groupwise(x.bfloat16(), 32)
    assert scales.item() == 1.0
    assert dequantised[0, :8].tolist() == [6.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, -4.0]


def test_quantising_twice_changes_nothing() -> None:
    x = wide_range(256, 256, seed=4)
    once, _ = fp8_blockwise(x, (128, 128))
    assert torch.equal(fp8_blockwise(once, (128, 128))[0], once)
    once4, _ = fp4_groupwise(x, 32)
    assert torch.equal(fp4_groupwise(once4, 32)[0], once4)


def test_bad_inputs_name_the_fix() -> None:
    with pytest.raises(TypeError, match=r"bf16 input \(got torch.float32\).*to\(torch.bfloat16\)"):
        fp8_blockwise(torch.zeros(128, 128), (128, 128))
    with pytest.raises(ValueError, match=r"\(128, 200\) does not split into 128x128 tiles"):
        fp8_blockwise(torch.zeros(128, 200, dtype=torch.bfloat16), (128, 128))
    with pytest.raises(ValueError, match="not a multiple of the 32-wide tiles"):
        fp4_groupwise(torch.zeros(4, 48, dtype=torch.bfloat16), 32)
