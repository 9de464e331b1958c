"""Run the Triton quantisers in Triton's CPU interpreter (TRITON_INTERPRET=1, set by the caller)
against the PyTorch reference; prints one JSON line per case.

The interpreter emulates fp32 -> fp8 casts wrongly (it does not round to nearest even), so for
FP8 only the scales (which also check the kernels' indexing) are compared here; FP4, computed in
fp32 arithmetic, is compared bit for bit. bench/gpu/qat_check.py compares everything on a GPU.
"""

from __future__ import annotations

import json

import torch

from graft_deepseek_v4.quant import reference
from graft_deepseek_v4.quant import triton_kernels as fused


def inputs(*shape: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    magnitude = torch.exp(torch.empty(shape).uniform_(-20, 15, generator=generator))
    x = torch.randn(shape, generator=generator) * magnitude
    x.view(-1)[:3] = torch.tensor([0.0, -0.0, 6.0 * 2.0**-5])
    return x.bfloat16()


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({torch.bfloat16: torch.int16, torch.float32: torch.int32}[t.dtype])


def main() -> None:
    for name, x, block in [("rows 1x128", inputs(70, 256, seed=0), (1, 128)),
                           ("kv 1x64", inputs(33, 128, seed=1), (1, 64)),
                           ("tiles 128x128", inputs(2, 256, 128, seed=2), (128, 128))]:
        ours, theirs = reference.fake_quant_fp8(x, block), fused.fake_quant_fp8(x, block)
        codes_scales = fused.quantize_fp8(x, block)[1]
        print(json.dumps({"case": name, "scales_equal": torch.equal(bits(ours[1]), bits(theirs[1]))
                          and torch.equal(bits(ours[1]), bits(codes_scales))}))
    x = inputs(3, 40, 96, seed=3)
    ours, theirs = reference.fake_quant_fp4(x, 32), fused.fake_quant_fp4(x, 32)
    print(json.dumps({"case": "fp4 1x32", "scales_equal": torch.equal(bits(ours[1]), bits(theirs[1])),
                      "output_equal": torch.equal(bits(ours[0]), bits(theirs[0]))}))


if __name__ == "__main__":
    main()
