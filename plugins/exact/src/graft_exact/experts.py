"""``graft_exact``: the MoE experts implementation `install_exact_kernels` gives a model.

transformers dispatches an experts module's forward by ``config._experts_implementation``;
grouped GEMMs (its default) have no exact kernel. On CUDA this implementation is
`graft_exact.triton_experts` (grouped, batch-invariant, capturable in a CUDA graph);
elsewhere it is transformers' own ``eager`` loop over the hit experts, whose products the exact
mode makes exact (one linear layer per expert: a row of a product is independent of the others).
Both sides of a run (the trainer's forward and the rollout's decode) run on the same device, so
they take the same path.
"""

from __future__ import annotations

from typing import Any

import torch

EXACT_EXPERTS = "graft_exact"


def exact_experts_forward(self: torch.nn.Module, hidden_states: torch.Tensor,
                          top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
    """transformers' experts interface: ``(tokens, hidden)`` from the tokens' hidden states,
    their chosen experts ``(tokens, k)`` and routing weights ``(tokens, k)``."""
    if hidden_states.is_cuda:
        from graft_exact.triton_experts import triton_experts_forward

        return triton_experts_forward(self, hidden_states, top_k_index, top_k_weights)
    return type(self).forward.__wrapped__(self, hidden_states, top_k_index, top_k_weights)


def grouped_experts_supported(model: torch.nn.Module) -> bool:
    """Whether every experts module of ``model`` has the layout `exact_experts_forward` serves
    (transformers' convention, ``(E, out, in)`` weights, no biases, not expert-parallel, its
    eager forward reachable)."""
    experts = [m for m in model.modules() if hasattr(m, "num_experts") and hasattr(m, "has_gate")]
    return bool(experts) and all(_served(m) for m in experts)


def _served(module: Any) -> bool:
    return (not module.has_bias and not module.is_transposed
            and not getattr(module, "_is_expert_parallel", False)
            and hasattr(type(module).forward, "__wrapped__"))


def register_exact_experts() -> None:
    """Register `EXACT_EXPERTS` with transformers' experts registry (idempotent)."""
    from transformers.integrations.moe import ExpertsInterface

    ExpertsInterface.register(EXACT_EXPERTS, exact_experts_forward)
