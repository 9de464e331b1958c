"""``features.deepseek_v4``: QAT settings (cheap to import: no torch). GSPO, which this plugin
once provided, is graft-gspo's ``loss.policy_loss=gspo`` (its settings: ``features.gspo.*``)."""

from __future__ import annotations

from dataclasses import dataclass

from graft.config import choice

QAT_MODES = ("none", "fp8_blockwise", "fp8_blockwise_gemm")


@dataclass
class DeepseekV4Config:
    """Settings of graft-deepseek-v4, under ``features.deepseek_v4``."""

    # Quantisation-aware training: none; fp8_blockwise (bf16 fake quant of what FP8 inference
    # quantises, straight-through gradients); fp8_blockwise_gemm (the same, with the plain
    # linear layers run as real FP8 block-scaled GEMMs; CUDA SM90+).
    qat: str = choice("none", QAT_MODES)
    # Quantiser implementation: auto (Triton on a CUDA GPU of SM89 or newer, whose FP8 casts Triton
    # compiles; PyTorch otherwise), torch, triton.
    qat_kernel: str = choice("auto", ("auto", "torch", "triton"))
    # Routed experts' weight format: auto (the model config's expert_dtype, fp8 when it has
    # none), fp4 (E2M1, 1x32 groups) or fp8 (128x128 tiles).
    expert_dtype: str = choice("auto", ("auto", "fp4", "fp8"))
