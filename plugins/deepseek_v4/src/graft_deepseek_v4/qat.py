"""Quantisation-aware training: the precision map applied to a model (``graft_pre_shard``).

Weights are fake-quantised once per optimizer step, in place (`graft_deepseek_v4.weights`);
activations on every forward, by hooks on the covered modules: a GEMM's input (1x128 tiles), the
routed experts' gated activation (the input of their second GEMM), the KV cache entries (1x64 on
the non-RoPE channels), the indexer's query and keys. Every fake quantisation is
quantise -> dequantise to bf16 with a straight-through gradient. Under ``qat=fp8_blockwise_gemm``
the plain linear layers run a real FP8 block-scaled GEMM instead (`graft_deepseek_v4.fp8_gemm`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch

from graft_deepseek_v4.fp8_gemm import BlockGemm
from graft_deepseek_v4.precision import (
    EXPERT_WEIGHTS,
    FP4_GROUP,
    INDEXER_QK,
    INPUT_ROWS,
    KV_NOPE,
    KV_TILE,
    TILE,
    WEIGHT_TILES,
    Target,
)
from graft_deepseek_v4.quant.kernels import Kernels
from graft_deepseek_v4.weights import QuantizedWeight, WeightQuantizer

Quantizer = Callable[[torch.Tensor], torch.Tensor]


class _StraightThrough(torch.autograd.Function):
    """``quantizer(x)`` forward, identity backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, quantizer: Quantizer) -> torch.Tensor:
        return quantizer(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def straight_through(x: torch.Tensor, quantizer: Quantizer) -> torch.Tensor:
    """``quantizer`` applied to ``x`` (through bf16, back in ``x``'s dtype), gradient passed
    straight through to ``x``."""
    return _StraightThrough.apply(x, lambda t: quantizer(t.to(torch.bfloat16)).to(t.dtype))


@dataclass
class QatModel:
    """What QAT installed on one model: its weight quantizer, hook handles, and the settings it
    was installed with (kernels, expert format, FP8 GEMM or None), which a copy of the model
    gets too."""

    weights: WeightQuantizer
    targets: list[Target]
    handles: list[Any] = field(default_factory=list)
    kernels: Kernels | None = None
    expert_dtype: str = "fp8"
    gemm: BlockGemm | None = None


def apply_qat(model: torch.nn.Module, targets: list[Target], *, kernels: Kernels,
              expert_dtype: str, keep_masters: bool, gemm: BlockGemm | None = None) -> QatModel:
    """Install fake quantisation for ``targets`` (from `resolve_targets`) on ``model``.

    ``keep_masters``: a trained model (masters restored before each optimizer step); False for
    a frozen one. ``gemm``: run the plain linear targets as FP8 block-scaled GEMMs with it
    (`graft_deepseek_v4.fp8_gemm`); None keeps every GEMM in bf16.
    """
    if gemm is not None:
        from graft_deepseek_v4.fp8_gemm import use_fp8_gemms

        use_fp8_gemms(model, [t for t in targets if _is_plain_linear(t.module)], kernels, gemm)
    rows = partial(_rows, kernels)
    weights, handles = [], []
    for target in targets:
        rule = target.rule
        module = model.get_submodule(target.name)  # the FP8 GEMM module where swapped
        if rule.weight == WEIGHT_TILES:
            weights.append(QuantizedWeight(f"{target.name}.weight", module, "weight",
                                           partial(kernels.fp8, block=(TILE, TILE)), TILE))
        if rule.weight == EXPERT_WEIGHTS:
            for attr in ("gate_up_proj", "down_proj"):
                weights.append(QuantizedWeight(f"{target.name}.{attr}", module, attr,
                                               expert_quantizer(kernels, expert_dtype), 1))
        if rule.inputs == INPUT_ROWS and module is target.module:
            handles.append(module.register_forward_pre_hook(partial(_quantize_input, rows)))
        if rule.inner == INPUT_ROWS:
            module._apply_gate = _gated_then_quantized(module._apply_gate, rows)
        if rule.output == KV_NOPE:
            nope = module.weight.shape[0] - model.config.qk_rope_head_dim
            handles.append(module.register_forward_hook(partial(_quantize_kv, kernels, nope)))
        if rule.inputs == INDEXER_QK:
            handles.append(module.register_forward_pre_hook(partial(_quantize_qk, rows)))
    quantizer = WeightQuantizer(weights, keep_masters=keep_masters)
    handles.append(model.register_forward_pre_hook(lambda module, args: quantizer.quantize()))
    return QatModel(quantizer, targets, handles, kernels=kernels, expert_dtype=expert_dtype,
                    gemm=gemm)


def expert_quantizer(kernels: Kernels, expert_dtype: str) -> Quantizer:
    """Stacked expert weights ``(E, out, in)``: FP4 in 1x32 groups along the input dim, or FP8
    128x128 tiles within each expert (tiles never straddle two experts)."""
    if expert_dtype == "fp4":
        return partial(kernels.fp4, group=FP4_GROUP)
    return partial(kernels.fp8, block=(TILE, TILE))


def _is_plain_linear(module: torch.nn.Module) -> bool:
    return type(module) is torch.nn.Linear


def _rows(kernels: Kernels, x: torch.Tensor, width: int = TILE) -> torch.Tensor:
    return straight_through(x, partial(kernels.fp8, block=(1, width)))


def _quantize_input(rows: Quantizer, module: torch.nn.Module, args: tuple) -> tuple:
    return (rows(args[0]), *args[1:])


def _gated_then_quantized(apply_gate: Callable[[torch.Tensor], torch.Tensor],
                          rows: Quantizer) -> Callable[[torch.Tensor], torch.Tensor]:
    def quantized_gate(gate_up: torch.Tensor) -> torch.Tensor:
        return rows(apply_gate(gate_up))

    return quantized_gate


def _quantize_kv(kernels: Kernels, nope: int, module: torch.nn.Module, args: tuple,
                 kv: torch.Tensor) -> torch.Tensor:
    quantized = straight_through(kv[..., :nope], partial(kernels.fp8, block=(1, KV_TILE)))
    return torch.cat([quantized, kv[..., nope:]], dim=-1)


def _quantize_qk(rows: Quantizer, module: torch.nn.Module, args: tuple) -> tuple:
    query, keys, *rest = args
    return (rows(query), rows(keys), *rest)
