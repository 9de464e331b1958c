"""The rotary position embedding of an exact model as one kernel per tensor on CUDA
(`graft_exact.triton_rotary`).

transformers' attention calls its modeling module's ``apply_rotary_pos_emb`` (a module global,
not a layer). `install_exact_rotary` wraps that global in the modeling modules of ``model``'s
attention layers when it is, line for line, Llama's (Qwen3 and others copy it): inside
`graft_exact.exact_kernels` on CUDA, with queries, keys and tables of one dtype, the
wrapper rotates with the Triton kernel; anywhere else (CPU, outside the mode, another model of
that family in the same process) it calls the original. The trainer and the embedded engine
run the same modeling code, so both rotate a token with the same kernel. The gradient is the
rotation's transpose through the ordinary kernels.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from typing import Any

import torch

from graft_exact.code_form import same_code
from graft_exact.mode import exact_active, ordinary_kernels

_MARK = "__graft_exact_rotary__"


def llama_form_rotary(module: Any) -> bool:
    """Whether the modeling ``module``'s ``apply_rotary_pos_emb`` and ``rotate_half`` are,
    line for line, Llama's (or already wrapped here)."""
    from transformers.models.llama import modeling_llama as llama

    apply = getattr(module, "apply_rotary_pos_emb", None)
    if getattr(apply, _MARK, False):
        return True
    reference = llama.apply_rotary_pos_emb  # Llama's own may be wrapped already
    return (same_code(_plain_function(apply),
                      _plain_function(getattr(reference, "__wrapped__", reference)))
            and same_code(getattr(module, "rotate_half", None), llama.rotate_half))


def _plain_function(function: Any) -> Any:
    """``function`` itself, or the one function inside it when it is the ``kernels`` package's
    module form of a function (transformers' ``use_kernel_forward_from_hub`` on a function
    makes one wherever ``kernels`` is installed: an ``nn.Module`` instance whose forward
    calls the function, held in the forward's closure); None for a module holding no single
    function."""
    if not isinstance(function, torch.nn.Module):
        return function
    cells = getattr(type(function).forward, "__closure__", None) or ()
    inner = [cell.cell_contents for cell in cells if inspect.isfunction(cell.cell_contents)]
    return inner[0] if len(inner) == 1 else None


def _rotate_half_transposed(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((second, -first), dim=-1)


class _ExactRotary(torch.autograd.Function):
    """The kernel forward; the gradient ``g * cos + rotate_half^T(g * sin)``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        from graft_exact.triton_rotary import rotate

        ctx.save_for_backward(cos, sin)
        return rotate(x, cos, sin)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        cos, sin = (t.unsqueeze(1) for t in ctx.saved_tensors)
        with ordinary_kernels():
            return grad * cos + _rotate_half_transposed(grad * sin), None, None


def _exact_apply(original: Callable[..., Any]) -> Callable[..., Any]:
    # updated=(): a `kernels` function module's __dict__ is its nn.Module state, not a function's
    @functools.wraps(original, updated=())
    def apply_rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                             sin: torch.Tensor, unsqueeze_dim: int = 1) -> Any:
        if (exact_active() and q.is_cuda and unsqueeze_dim == 1 and q.dim() == 4
                and q.dtype == k.dtype == cos.dtype == sin.dtype and q.shape[-1] % 2 == 0
                and not (cos.requires_grad or sin.requires_grad)):
            return _ExactRotary.apply(q, cos, sin), _ExactRotary.apply(k, cos, sin)
        return original(q, k, cos, sin, unsqueeze_dim)

    setattr(apply_rotary_pos_emb, _MARK, True)
    return apply_rotary_pos_emb


def install_exact_rotary(model: torch.nn.Module) -> list[str]:
    """Wrap ``apply_rotary_pos_emb`` in the modeling modules of ``model``'s layers where it is
    Llama's (once per module); returns the modules' names."""
    names = sorted({type(layer).__module__ for layer in model.modules()})
    wrapped = []
    for name in names:
        module = sys.modules.get(name)
        if module is None or not llama_form_rotary(module):
            continue
        if not getattr(module.apply_rotary_pos_emb, _MARK, False):
            module.apply_rotary_pos_emb = _exact_apply(module.apply_rotary_pos_emb)
        wrapped.append(name)
    return wrapped
