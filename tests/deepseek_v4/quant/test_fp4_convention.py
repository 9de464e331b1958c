"""Graft's FP4 experts (E2M1, 1x32 groups, UE8M0 scales) follow DeepSeek-V4's quantiser, checked
against two implementations that share no code with ours.

DeepSeek-V4's ``inference/kernel.py`` (``fp4_quant_kernel``; vLLM's DeepSeek-V4 code quantises
FP4 with the same formula and cites it): ``amax = max(|x| over the group, 6 * 2^-126)``, scale
``2^ceil(log2(amax / 6))``, each element ``x / scale`` clamped to [-6, 6] and cast to E2M1 (round
to nearest, ties to even). That is torchao's ``ScaleCalculationMode.RCEIL``; the OCP MX spec's
``FLOOR`` (``2^(floor(log2 amax) - 2)``, saturating) gives other scales.

The formula is written out here independently (``deepseek_v4_fp4``, float64), and always runs.
The torchao comparison runs where torchao is importable. It is not in the dev requirements:
with torchao installed, importing transformers' modeling code imports torchao too, in every
process. To run it: ``pip install --no-deps --target /tmp/torchao torchao==0.18.0`` (pure
PyTorch on CPU, pulls nothing), then ``PYTHONPATH=/tmp/torchao pytest`` this file.
"""

from __future__ import annotations

import pytest
import torch

from graft_deepseek_v4.quant import fp4_groupwise

E2M1_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)


def deepseek_v4_fp4(x: torch.Tensor, group: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V4's FP4 fake quant written from its formula, in float64 (exact for bf16 input):
    the nearest E2M1 value by distance, a tie going to the even code (the E2M1 values in code
    order are ``E2M1_VALUES``)."""
    groups = x.double().reshape(*x.shape[:-1], x.shape[-1] // group, group)
    amax = groups.abs().amax(-1, keepdim=True).clamp(min=6 * 2.0**-126)
    scale = torch.exp2(torch.ceil(torch.log2(amax / 6)))
    scaled = (groups / scale).clamp(-6, 6)
    distance = (scaled.abs()[..., None] - E2M1_VALUES).abs()
    nearest = distance == distance.min(-1, keepdim=True).values  # one value, or two on a tie
    even = nearest & (torch.arange(8) % 2 == 0)
    code = torch.where(even.any(-1), even.double().argmax(-1), nearest.double().argmax(-1))
    values = E2M1_VALUES[code].copysign(scaled)
    return (values * scale).reshape(x.shape).to(torch.bfloat16), scale.squeeze(-1).float()


def groups_of_every_magnitude(seed: int) -> torch.Tensor:
    """(8, 64, 256) bf16: groups of 32 whose amax spans 2^-140 .. 2^120 (below DeepSeek's
    amax floor, around 1e-4 and far above), ties of the E2M1 grid, exact powers of two."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(8, 64, 8, 32, generator=generator, dtype=torch.float64)
    exponents = torch.randint(-140, 120, (8, 64, 8, 1), generator=generator)
    x = x * torch.exp2(exponents.double())
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0], dtype=torch.float64)
    x[0, :, 0, :8] = ties * torch.exp2(torch.arange(-60, 68, 2.0))[:, None]  # amax 6 * 2^k
    x[0, :, 1, :3] = torch.tensor([7.0, -6.5, 1e-3], dtype=torch.float64)  # amax above 6 * 2^0
    x[1, :, 0, :] = 0.0  # all-zero groups
    return x.to(torch.bfloat16)


def bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.int16 if x.dtype == torch.bfloat16 else torch.int32)


@pytest.mark.parametrize("seed", [0, 1])
def test_fp4_is_deepseek_v4_s_quantiser_bit_for_bit(seed: int) -> None:
    x = groups_of_every_magnitude(seed).reshape(8, 64, 256)
    ours, our_scales = fp4_groupwise(x, 32)
    theirs, their_scales = deepseek_v4_fp4(x)
    assert torch.equal(bits(our_scales), bits(their_scales))
    assert torch.equal(bits(ours), bits(theirs))


def test_groups_below_the_amax_floor_keep_their_values() -> None:
    """DeepSeek floors the FP4 amax at 6 * 2^-126 (the smallest scale 2^-126); a floor of 1e-4
    (its FP8 one) would round every element of a group with amax < 1e-4 / 6 to 0."""
    x = (torch.linspace(-1, 1, 64) * 3e-6).bfloat16().reshape(2, 32)
    ours, scales = fp4_groupwise(x, 32)
    assert torch.equal(scales, torch.full((2, 1), 2.0**-20))  # 3e-6 / 6 <= 2^-20
    assert torch.count_nonzero(ours) > 40
    assert torch.equal(bits(ours), bits(deepseek_v4_fp4(x)[0]))


def torchao_fp4(x: torch.Tensor, mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    """torchao's MX cast of ``x`` to FP4 (E2M1, blocks of 32) with ``mode`` scales, dequantised:
    ``(bf16 values, fp32 scales)``."""
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.kernels import f4_unpacked_to_f32, unpack_uint4
    from torchao.prototype.mx_formats.mx_tensor import get_fp_scale, to_mx

    scales, packed = to_mx(x.contiguous(), torch.float4_e2m1fn_x2, 32,
                           ScaleCalculationMode(mode))
    values = f4_unpacked_to_f32(unpack_uint4(packed.view(torch.uint8))).reshape(
        *x.shape[:-1], x.shape[-1] // 32, 32)
    scale = get_fp_scale(scales)
    return (values * scale[..., None]).reshape(x.shape).to(torch.bfloat16), scale


def test_fp4_equals_torchao_s_rceil_mx_cast_and_not_the_ocp_floor() -> None:
    pytest.importorskip("torchao.prototype.mx_formats")
    x = groups_of_every_magnitude(2).reshape(8, 64, 256)
    # torchao has no amax floor (its scales go down to 2^-127): compare the groups above it
    normal = (x.float().reshape(8, 64, 8, 32).abs().amax(-1) >= 6 * 2.0**-126)
    assert 0.8 < normal.float().mean() < 1.0
    ours, our_scales = fp4_groupwise(x, 32)
    theirs, their_scales = torchao_fp4(x, "rceil")
    assert torch.equal(our_scales[normal], their_scales[normal])
    same = (bits(ours) == bits(theirs)).reshape(8, 64, 8, 32).all(-1)
    assert same[normal].all()
    _, floor_scales = torchao_fp4(x, "floor")  # the OCP MX spec's rule: another convention
    assert (our_scales[normal] != floor_scales[normal]).float().mean() > 0.2
