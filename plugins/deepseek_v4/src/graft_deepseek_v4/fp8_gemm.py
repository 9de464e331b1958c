"""``qat=fp8_blockwise_gemm``: plain linear layers computed with real FP8 block-scaled GEMMs.

The forward quantises the input in 1x128 tiles and the (already fake-quantised, see
`graft_deepseek_v4.weights`) weight in 128x128 tiles to FP8 E4M3 codes and power-of-two scales,
and multiplies them with ``torch.nn.functional.scaled_mm`` (``BlockWise1x128`` x
``BlockWise128x128``, fp32 accumulation, bf16 output): the same products as the fake-quant
forward (a bf16 GEMM of the dequantised operands), up to the GEMM's accumulation order and bf16
rounding. The backward is the fake-quant one (straight-through): bf16 GEMMs of the output
gradient with the dequantised weight and input. Needs CUDA with FP8 (SM90+) and a torch with
``F.scaled_mm`` block scaling (2.10+).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from graft.errors import ConfigError
from graft_deepseek_v4.precision import TILE, Target
from graft_deepseek_v4.quant.kernels import Kernels
from graft_deepseek_v4.quant.reference import dequantize

# gemm(x_codes (M, K), x_scales (M, K/128), w_codes (N, K), w_scales (N/128, K/128)) -> (M, N) bf16
BlockGemm = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
ROW_ALIGN = 16  # rows per GEMM padded to a multiple of this


def scaled_mm_blockwise(x_codes: torch.Tensor, x_scales: torch.Tensor, w_codes: torch.Tensor,
                        w_scales: torch.Tensor) -> torch.Tensor:
    """``x @ w.T`` with torch's FP8 block-scaled GEMM (scale layouts as it requires them)."""
    from torch.nn.functional import ScalingType, scaled_mm

    return scaled_mm(x_codes, w_codes.t(), x_scales.t().contiguous().t(),
                     ScalingType.BlockWise1x128, w_scales.t(), ScalingType.BlockWise128x128,
                     output_dtype=torch.bfloat16)


def emulated_blockwise(x_codes: torch.Tensor, x_scales: torch.Tensor, w_codes: torch.Tensor,
                       w_scales: torch.Tensor) -> torch.Tensor:
    """The same product in fp32 from the dequantised operands, bf16 output (for CPU tests)."""
    x = dequantize(x_codes, x_scales, (1, TILE)).float()
    w = dequantize(w_codes, w_scales, (TILE, TILE)).float()
    return (x @ w.t()).to(torch.bfloat16)


def check_fp8_gemm_support(device: torch.device) -> None:
    """`ConfigError` unless ``device`` runs ``F.scaled_mm`` with block-wise FP8 scales."""
    fix = "use features.deepseek_v4.qat=fp8_blockwise (bf16 fake quant) instead"
    if device.type != "cuda" or torch.cuda.get_device_capability(device) < (9, 0):
        raise ConfigError(f"features.deepseek_v4.qat=fp8_blockwise_gemm needs a CUDA GPU with "
                          f"FP8 tensor cores (compute capability 9.0 or newer); the model is on "
                          f"{device}; {fix}")
    try:
        from torch.nn.functional import ScalingType, scaled_mm  # noqa: F401
    except ImportError:
        raise ConfigError(f"features.deepseek_v4.qat=fp8_blockwise_gemm needs torch >= 2.10 "
                          f"(torch.nn.functional.scaled_mm with block-wise scales); this is "
                          f"torch {torch.__version__}; {fix}") from None


class _Fp8BlockGemm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, kernels: Kernels,
                gemm: BlockGemm) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
        pad = -rows.shape[0] % ROW_ALIGN
        if pad:
            rows = torch.nn.functional.pad(rows, (0, 0, 0, pad))
        x_codes, x_scales = kernels.quantize_fp8(rows, (1, TILE))
        w_codes, w_scales = kernels.quantize_fp8(weight.to(torch.bfloat16), (TILE, TILE))
        out = gemm(x_codes, x_scales, w_codes, w_scales)[:rows.shape[0] - pad]
        ctx.save_for_backward(x_codes, x_scales, weight)
        ctx.pad, ctx.input_shape, ctx.input_dtype = pad, x.shape, x.dtype
        return out.reshape(*x.shape[:-1], weight.shape[0]).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x_codes, x_scales, weight = ctx.saved_tensors
        x = dequantize(x_codes, x_scales, (1, TILE))[:x_codes.shape[0] - ctx.pad]
        grad_rows = grad.reshape(-1, grad.shape[-1])
        grad_x = (grad_rows @ weight.to(grad.dtype)).reshape(ctx.input_shape).to(ctx.input_dtype)
        grad_w = (grad_rows.t() @ x.to(grad.dtype)).to(weight.dtype)
        return grad_x, grad_w, None, None


class Fp8BlockLinear(torch.nn.Module):
    """A bias-free ``nn.Linear`` whose forward is an FP8 block-scaled GEMM (same ``weight``
    parameter, so names, sharding and checkpoints are unchanged)."""

    def __init__(self, linear: torch.nn.Linear, kernels: Kernels,
                 gemm: BlockGemm = scaled_mm_blockwise) -> None:
        super().__init__()
        if linear.bias is not None:
            raise ValueError("Fp8BlockLinear: DeepSeek-V4's linear layers have no bias")
        self.weight = linear.weight
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.kernels, self.gemm = kernels, gemm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ weight.T`` through FP8 codes of both operands."""
        return _Fp8BlockGemm.apply(x, self.weight, self.kernels, self.gemm)


def use_fp8_gemms(model: torch.nn.Module, targets: Sequence[Target], kernels: Kernels,
                  gemm: BlockGemm = scaled_mm_blockwise) -> None:
    """Replace each target's linear layer in ``model`` by an `Fp8BlockLinear`."""
    for target in targets:
        parent_name, _, child = target.name.rpartition(".")
        setattr(model.get_submodule(parent_name), child,
                Fp8BlockLinear(target.module, kernels, gemm))
