"""`install_exact_kernels`: switch a model to the exact attention and the per-expert MoE path."""

from __future__ import annotations

from typing import Any

import torch

from graft.engine.exact.attention import EXACT_ATTENTION, register_exact_attention
from graft.engine.exact.support import check_exact_support


def install_exact_kernels(model: torch.nn.Module, family: Any = None) -> None:
    """Make ``model`` (a transformers ``PreTrainedModel``, before sharding) attend with
    `graft.engine.exact.attention` and run its MoE experts one linear layer per expert
    (transformers' ``eager`` experts: grouped GEMMs have no exact kernel); the products and
    reductions become exact inside `graft.engine.exact.exact_kernels`. A model the kernels
    cannot serve is a `ConfigError` (`check_exact_support`)."""
    check_exact_support(model.config, family)
    register_exact_attention()
    model.set_attn_implementation(EXACT_ATTENTION)
    if getattr(model.config, "_experts_implementation", None) not in (None, "eager"):
        model.set_experts_implementation("eager")
