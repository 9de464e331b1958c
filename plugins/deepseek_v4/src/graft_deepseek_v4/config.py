"""``features.deepseek_v4``: QAT and GSPO settings (cheap to import: no torch)."""

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
    # Quantiser implementation: auto (Triton on CUDA, PyTorch otherwise), torch, triton.
    qat_kernel: str = choice("auto", ("auto", "torch", "triton"))
    # Routed experts' weight format: auto (the model config's expert_dtype, fp8 when it has
    # none), fp4 (E2M1, 1x32 groups) or fp8 (128x128 tiles).
    expert_dtype: str = choice("auto", ("auto", "fp4", "fp8"))
    # GSPO: rollout importance weights min(exp(old - rollout), cap) per token, or per sequence
    # (geometric mean over its tokens); none turns them off.
    gspo_rollout_is: str = choice("none", ("none", "token", "sequence"))
    gspo_rollout_is_cap: float = 2.0

    def __post_init__(self) -> None:
        if not self.gspo_rollout_is_cap > 0:
            raise ValueError(f"features.deepseek_v4.gspo_rollout_is_cap={self.gspo_rollout_is_cap} "
                             f"must be > 0 (the truncation of the rollout importance weights, "
                             f"e.g. 2.0)")
