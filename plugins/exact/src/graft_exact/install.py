"""`install_exact_kernels`: switch a model to the exact attention, MoE experts, RMSNorms and
rotary embedding."""

from __future__ import annotations

from typing import Any

import torch

from graft_exact.attention import EXACT_ATTENTION, register_exact_attention
from graft_exact.experts import EXACT_EXPERTS, grouped_experts_supported, register_exact_experts
from graft_exact.norm import install_exact_norms
from graft_exact.rotary import install_exact_rotary
from graft_exact.support import check_exact_support


def install_exact_kernels(model: torch.nn.Module, family: Any = None) -> None:
    """Make ``model`` (a transformers ``PreTrainedModel``, before sharding) attend with
    `graft_exact.attention` and run its MoE experts with `graft_exact.experts`
    (experts of another layout: transformers' ``eager`` loop; grouped GEMMs have no exact
    kernel), its Llama-form RMSNorms and rotary embedding with `graft_exact.norm` and
    `graft_exact.rotary` (one kernel each on CUDA);
    the products and reductions become exact inside `graft_exact.exact_kernels`. A
    model the kernels cannot serve is a `ConfigError` (`check_exact_support`)."""
    check_exact_support(model.config, family)
    register_exact_attention()
    model.set_attn_implementation(EXACT_ATTENTION)
    if grouped_experts_supported(model):
        register_exact_experts()
        model.set_experts_implementation(EXACT_EXPERTS)
    elif getattr(model.config, "_experts_implementation", None) not in (None, "eager"):
        model.set_experts_implementation("eager")
    install_exact_norms(model)
    install_exact_rotary(model)
