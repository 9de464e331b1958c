"""The adapted modules. An adapted module keeps its class's behaviour and its parameters'
names (``q_proj.weight``, ``experts.gate_up_proj``): its class becomes a subclass that adds
the adapters' term, so checkpoints of the base, exports and FSDP2 see the module they know.

* A linear layer gets ``lora_A`` (rank x in) and ``lora_B`` (out x rank) and computes
  ``base(x) + scale * B(A(dropout(x)))``.
* A fused experts module (3-D weights, one slice per expert) gets ``lora_A_<weight>``
  (experts x rank x in) and ``lora_B_<weight>`` (experts x out x rank) for each 3-D weight, and
  its forward reads ``weight + scale * B @ A`` per expert (one batched product per forward,
  as PEFT's ``target_parameters`` does), whatever expert kernel the forward then runs.
"""

from __future__ import annotations

import math
import zlib
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

# Adapted subclasses, one per (adapter kind, base class, adapted weights).
_CLASSES: dict[tuple[Any, ...], type] = {}


class LinearAdapter:
    """Mixin of an adapted ``nn.Linear`` (or subclass): the low-rank term added to its output."""

    lora_A: nn.Parameter
    lora_B: nn.Parameter
    lora_scale: float
    lora_dropout: float

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102 (nn.Linear's, plus B A x)
        out = super().forward(x)  # type: ignore[misc]
        if self.lora_dropout and self.training:
            x = F.dropout(x, self.lora_dropout)
        # fp32 adapters beside a base kept in bf16 without mixed precision: in the input's dtype
        a, b = self.lora_A.to(x.dtype), self.lora_B.to(x.dtype)
        return out + F.linear(F.linear(x, a), b) * self.lora_scale

    def adapted_weights(self) -> dict[str, tuple[str, str]]:
        """``{base weight: (A's name, B's name)}``."""
        return {"weight": ("lora_A", "lora_B")}

    def weight_delta(self, weight: str) -> torch.Tensor:
        """``scale * B @ A``, the adapters' change of ``weight`` (out x in)."""
        return (self.lora_B @ self.lora_A) * self.lora_scale


class ExpertsAdapter:
    """Mixin of an adapted fused-experts module: while the class's forward runs, each adapted
    3-D weight reads as ``weight + scale * B @ A`` (computed once per forward: an expert kernel
    may read a weight once per expert); a forward installed on the instance (expert
    parallelism's) reads them through `expert_weight`."""

    lora_weights: tuple[str, ...]
    lora_scale: float
    lora_transposed: bool

    def forward(self, *args: Any, **kwargs: Any) -> Any:  # noqa: D102 (the class's, merged)
        self.__dict__["_lora_merged"] = {name: self.merged_weight(name)
                                         for name in self.lora_weights}
        try:
            return super().forward(*args, **kwargs)  # type: ignore[misc]
        finally:
            self.__dict__["_lora_merged"] = None

    def merged_weight(self, weight: str) -> torch.Tensor:
        """``weight + scale * B @ A`` in the weight's dtype (under expert parallelism: this
        rank's experts, DTensors over ``ep``, and so is the sum)."""
        base = self._parameters[weight]  # type: ignore[attr-defined]
        return base + self.weight_delta(weight).to(base.dtype)

    def expert_weight(self, name: str) -> torch.Tensor | None:
        """The weight ``name`` as the forward computes with it (`graft.engine.expert_weight`):
        merged with its adapters where it has them."""
        if name in self.lora_weights:
            return self.merged_weight(name)
        return getattr(self, name, None)

    def adapted_weights(self) -> dict[str, tuple[str, str]]:
        """``{base weight: (A's name, B's name)}``."""
        return {name: (f"lora_A_{name}", f"lora_B_{name}") for name in self.lora_weights}

    def weight_delta(self, weight: str) -> torch.Tensor:
        """``scale * B @ A`` per expert, in the weight's own layout (experts x out x in, or
        experts x in x out for transposed experts)."""
        a = getattr(self, f"lora_A_{weight}")
        b = getattr(self, f"lora_B_{weight}")
        delta = torch.bmm(b, a) * self.lora_scale
        return delta.transpose(1, 2) if self.lora_transposed else delta


def _merged_weight(name: str) -> property:
    def read(self: Any) -> torch.Tensor:
        merged = self.__dict__.get("_lora_merged")
        return merged[name] if merged else self._parameters[name]
    return property(read)


def _adapted_class(mixin: type, base: type, weights: tuple[str, ...] = ()) -> type:
    key = (mixin, base, weights)
    if key not in _CLASSES:
        namespace = {name: _merged_weight(name) for name in weights}
        _CLASSES[key] = type(f"Lora{base.__name__}", (mixin, base), namespace)
    return _CLASSES[key]


def adapt_linear(module: nn.Linear, *, rank: int, scale: float, dropout: float) -> None:
    """Give ``module`` adapters (on its weight's device, in `master_dtype`; initialised by
    `apply_lora`) and the adapted class."""
    weight = module.weight
    factory = {"device": weight.device, "dtype": master_dtype(weight)}
    module.lora_A = nn.Parameter(torch.zeros(rank, module.in_features, **factory))
    module.lora_B = nn.Parameter(torch.zeros(module.out_features, rank, **factory))
    module.lora_scale, module.lora_dropout = scale, dropout
    module.__class__ = _adapted_class(LinearAdapter, type(module))


def master_dtype(weight: torch.Tensor) -> torch.dtype:
    """The adapters' dtype beside ``weight``: at least fp32, so that a base built in bf16
    (``model.dtype=bfloat16``) still trains fp32 adapters."""
    return torch.promote_types(weight.dtype, torch.float32)


def expert_weights(module: nn.Module) -> tuple[str, ...]:
    """The names of ``module``'s own 3-D parameters (fused experts), in registration order."""
    return tuple(name for name, p in module.named_parameters(recurse=False) if p.dim() == 3)


def adapt_experts(module: nn.Module, *, rank: int, scale: float) -> None:
    """Give each 3-D weight of the fused experts ``module`` per-expert adapters, and the
    adapted class. transformers stores them experts x out x in unless the module says
    ``is_transposed`` (experts x in x out)."""
    weights = expert_weights(module)
    transposed = bool(getattr(module, "is_transposed", False))
    for name in weights:
        weight = module._parameters[name]
        experts, rows, cols = weight.shape
        fan_in, fan_out = (rows, cols) if transposed else (cols, rows)
        factory = {"device": weight.device, "dtype": master_dtype(weight)}
        module.register_parameter(f"lora_A_{name}",
                                  nn.Parameter(torch.zeros(experts, rank, fan_in, **factory)))
        module.register_parameter(f"lora_B_{name}",
                                  nn.Parameter(torch.zeros(experts, fan_out, rank, **factory)))
    module.lora_weights, module.lora_scale, module.lora_transposed = weights, scale, transposed
    module.__class__ = _adapted_class(ExpertsAdapter, type(module), weights)


@torch.no_grad()
def mirror_adapters(copy: nn.Module, adapted: nn.Module, values: dict[str, torch.Tensor]) -> None:
    """Make ``copy`` (the same layer in a plain copy of the model) compute what the adapted
    ``adapted`` computes, with the adapters unmerged: the first call gives it ``adapted``'s
    class and settings and the adapters as non-persistent buffers in ``copy``'s dtype (its
    parameters stay the base's); every call copies ``values`` (the adapters, whole, by name)
    in."""
    if not is_adapted(copy):
        base = next(copy.parameters())
        for name, value in values.items():
            copy.register_buffer(name, torch.empty(value.shape, dtype=base.dtype,
                                                   device=base.device), persistent=False)
        for setting in ("lora_scale", "lora_dropout", "lora_weights", "lora_transposed"):
            if hasattr(adapted, setting):
                setattr(copy, setting, getattr(adapted, setting))
        mixin = ExpertsAdapter if isinstance(adapted, ExpertsAdapter) else LinearAdapter
        copy.__class__ = _adapted_class(mixin, type(copy), getattr(adapted, "lora_weights", ()))
    for name, value in values.items():
        copy.get_buffer(name).copy_(value)


def is_adapted(module: nn.Module) -> bool:
    """Whether `adapt_linear` or `adapt_experts` adapted ``module``."""
    return isinstance(module, LinearAdapter | ExpertsAdapter)


def initial_value(name: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """An adapter's initial value (float32, CPU), the same on every rank and at any world size:
    an ``A`` (name ``lora_A...``) uniform in +-1/sqrt(fan in), PEFT's default (Kaiming uniform,
    a = sqrt(5)), from a generator keyed by ``seed`` and ``name``; a ``B`` zeros, so a fresh
    adapter changes nothing."""
    if ".lora_B" in name:
        return torch.zeros(shape)
    generator = torch.Generator().manual_seed(zlib.crc32(f"{seed}:{name}".encode()))
    bound = 1.0 / math.sqrt(shape[-1])
    return (torch.rand(shape, generator=generator) * 2 - 1) * bound
