"""The RMSNorms of an exact model as one kernel each on CUDA (`graft_exact.triton_norm`).

`install_exact_norms` gives every RMSNorm whose forward is transformers' Llama form (``weight *
(h * rsqrt(mean(h ** 2) + eps)).to(dtype)``, which Qwen3, Qwen3-MoE, Mistral and others copy
line for line) a forward that, inside `graft_exact.exact_kernels` on CUDA, runs the
one-program-per-row kernel; elsewhere (CPU, or outside the mode) it is the module's own forward,
which the mode makes exact. The trainer and the embedded engine install it alike, so both
compute a token's norm with the same kernel. Its gradient is the eager formula's, from the
forward's ``rsqrt`` per row, through the ordinary kernels (gradients need not be
batch-invariant). Norms of another form (Gemma's ``1 + weight``, a hub kernel) keep their
forward.
"""

from __future__ import annotations

import types
from typing import Any

import torch

from graft_exact.code_form import same_code
from graft_exact.mode import exact_active, ordinary_kernels


def llama_form_rms_norm(module: torch.nn.Module) -> bool:
    """Whether ``module``'s forward is, line for line, transformers' ``LlamaRMSNorm.forward``
    (a 1-D ``weight`` and a ``variance_epsilon``)."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    weight = getattr(module, "weight", None)
    return (isinstance(weight, torch.Tensor) and weight.dim() == 1
            and isinstance(getattr(module, "variance_epsilon", None), float)
            and same_code(type(module).forward, LlamaRMSNorm.forward))


def eager_rms_norm(hidden: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' Llama RMSNorm, operation for operation."""
    work = hidden.to(torch.float32)
    work = work * torch.rsqrt(work.pow(2).mean(-1, keepdim=True) + eps)
    return weight * work.to(hidden.dtype)


class _ExactRMSNorm(torch.autograd.Function):
    """The kernel forward; the backward is the eager formula's gradient (`rms_norm_backward`)."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        from graft_exact.triton_norm import rms_norm_rows

        out, rstd = rms_norm_rows(hidden, weight, eps)
        ctx.save_for_backward(hidden, weight, rstd)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        hidden, weight, rstd = ctx.saved_tensors
        with ordinary_kernels():
            grad_hidden, grad_weight = rms_norm_backward(grad, hidden, weight, rstd)
        return (grad_hidden if ctx.needs_input_grad[0] else None,
                grad_weight if ctx.needs_input_grad[1] else None, None)


def rms_norm_backward(grad: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor,
                      rstd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradients of `eager_rms_norm` for the incoming ``grad``, from the forward's
    ``rstd`` (fp32, ``(..., 1)``): with ``n = h * rstd`` and ``g = grad * weight`` (rounded as
    autograd rounds it), ``rstd * (g - n * mean(g * n))`` for ``hidden``, and ``grad`` times
    the rounded ``n`` summed over the rows for ``weight``."""
    normed = hidden.to(torch.float32) * rstd
    grad_normed = (grad * weight).to(torch.float32)
    dot = (grad_normed * normed).mean(-1, keepdim=True)
    grad_hidden = (rstd * (grad_normed - normed * dot)).to(hidden.dtype)
    grad_weight = (grad * normed.to(hidden.dtype)).reshape(-1, weight.shape[0]).sum(0)
    return grad_hidden, grad_weight.to(weight.dtype)


def _exact_norm_forward(self: torch.nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    if exact_active() and hidden_states.is_cuda:
        return _ExactRMSNorm.apply(hidden_states, self.weight, self.variance_epsilon)
    return type(self).forward(self, hidden_states)


def install_exact_norms(model: torch.nn.Module) -> int:
    """Give ``model``'s Llama-form RMSNorms the one-kernel exact forward; returns how many."""
    count = 0
    for module in model.modules():
        if llama_form_rms_norm(module):
            module.forward = types.MethodType(_exact_norm_forward, module)
            count += 1
    return count
