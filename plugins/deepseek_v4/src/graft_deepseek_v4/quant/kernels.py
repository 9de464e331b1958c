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


# The Triton kernels cast to FP8 E4M3 (``tl.float8e4nv``), which Triton compiles only for SM89
# and newer; on SM80 the kernel fails at its first launch.
TRITON_MIN_CAPABILITY = (8, 9)


def triton_unusable(device: torch.device) -> str | None:
    """Why the Triton kernels cannot run on ``device`` (a sentence), or None when they can: a
    CUDA device of compute capability >= `TRITON_MIN_CAPABILITY` with Triton installed."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return f"the model is on {device}, not a CUDA GPU"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "Triton is not installed"
    capability = tuple(torch.cuda.get_device_capability(device))
    if capability < TRITON_MIN_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        major, minor = TRITON_MIN_CAPABILITY
        return (f"the GPU ({name}) is SM{capability[0]}{capability[1]}; the kernels cast to FP8 "
                f"E4M3 (tl.float8e4nv), which Triton supports from SM{major}{minor} (Ada, Hopper) "
                f"on")
    return None


def triton_available() -> bool:
    """True when the current CUDA device runs the Triton kernels (`triton_unusable`)."""
    if not torch.cuda.is_available():
        return False
    return triton_unusable(torch.device("cuda", torch.cuda.current_device())) is None


def select_kernels(choice: str, device: torch.device) -> Kernels:
    """``features.deepseek_v4.qat_kernel``: ``auto`` (the Triton kernels where they run: a CUDA
    GPU of SM89 or newer with Triton installed; PyTorch otherwise), ``torch``, or ``triton``
    (a `ConfigError` saying why where they cannot run)."""
    if choice == "torch":
        return torch_kernels()
    reason = triton_unusable(device)
    if choice == "triton" and reason is not None:
        raise ConfigError(f"features.deepseek_v4.qat_kernel=triton cannot run here: {reason}. "
                          f"Use features.deepseek_v4.qat_kernel=auto or torch (the PyTorch "
                          f"quantisers, same bits)")
    return triton_kernels() if reason is None else torch_kernels()
