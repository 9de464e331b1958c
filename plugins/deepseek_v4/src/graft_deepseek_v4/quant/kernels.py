"""Which implementation fake-quantises: the PyTorch reference or the fused Triton kernels."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from graft.errors import ConfigError

# Every function takes bf16 and returns bf16 (fake quant) or (FP8 codes, fp32 scales).
FakeQuantFp8 = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class Kernels:
    """One implementation of the quantisers: ``fp8(x, block)`` and ``fp4(x, group)`` return the
    dequantised bf16 tensor; ``quantize_fp8(x, block)`` the FP8 codes and scales."""

    name: str
    fp8: FakeQuantFp8
    fp4: FakeQuantFp8
    quantize_fp8: Callable[..., tuple[torch.Tensor, torch.Tensor]]


def torch_kernels() -> Kernels:
    """The PyTorch reference (any device)."""
    from graft_deepseek_v4.quant import reference

    return Kernels("torch", lambda x, block: reference.fake_quant_fp8(x, block)[0],
                   lambda x, group: reference.fake_quant_fp4(x, group)[0],
                   reference.quantize_fp8)


def triton_kernels() -> Kernels:
    """The fused Triton kernels (CUDA)."""
    from graft_deepseek_v4.quant import triton_kernels as kernels

    return Kernels("triton", lambda x, block: kernels.fake_quant_fp8(x, block)[0],
                   lambda x, group: kernels.fake_quant_fp4(x, group)[0],
                   kernels.quantize_fp8)


def triton_available() -> bool:
    """True when Triton imports and a CUDA device is present."""
    if not torch.cuda.is_available():
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def select_kernels(choice: str, device: torch.device) -> Kernels:
    """``features.deepseek_v4.qat_kernel``: ``auto`` (Triton on CUDA when available, PyTorch
    otherwise), ``torch`` or ``triton`` (an error where it cannot run)."""
    if choice == "torch":
        return torch_kernels()
    usable = device.type == "cuda" and triton_available()
    if choice == "triton" and not usable:
        raise ConfigError(f"features.deepseek_v4.qat_kernel=triton needs a CUDA device with "
                          f"Triton installed (the model is on {device}); use qat_kernel=auto or "
                          f"torch")
    return triton_kernels() if usable else torch_kernels()
