"""`exact_kernels`: inside it, the model's products, reductions and activations take the exact
kernels (`graft_exact.matmul`, `graft_exact.reductions`).

A `TorchDispatchMode` swaps the ATen operators below autograd, so no model code changes and every
family is covered the same way: the linear layers, the MoE experts (`graft_exact.experts`;
transformers' ``eager`` experts call ``linear`` per expert) and routers, the norms (``mean``),
softmaxes and the log-prob's ``logsumexp``. Autograd records the original operators, so the
backward is the ordinary one, and its formulas run the ordinary kernels
(`_in_gradient_formula`). Operators that would reduce in a batch-dependent order and have no
exact kernel (SDPA, grouped GEMMs, fused norms) raise `ExactKernelError` instead of silently
rounding another way: the attention must be `graft_exact.attention`
(`install_exact_kernels`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from graft_exact.matmul import exact_addmm, exact_bmm, exact_mm
from graft_exact.reductions import (
    exact_log_softmax,
    exact_logsumexp,
    exact_sigmoid,
    exact_silu,
    exact_softmax,
    tree_mean,
    tree_sum,
)

aten = torch.ops.aten


class ExactKernelError(RuntimeError):
    """An operator without an exact kernel ran inside `exact_kernels`."""


def _float(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point()


def _softmax(x: torch.Tensor, dim: int, half_to_float: bool) -> torch.Tensor:
    return exact_softmax(x, dim, torch.float32 if half_to_float else x.dtype)


def _log_softmax(x: torch.Tensor, dim: int, half_to_float: bool) -> torch.Tensor:
    return exact_log_softmax(x, dim, torch.float32 if half_to_float else x.dtype)


def _reduction(kernel: Any) -> Any:
    def run(x: torch.Tensor, dim: Any = None, keepdim: bool = False, *,
            dtype: torch.dtype | None = None) -> torch.Tensor:
        return kernel(x, dim, keepdim, dtype=dtype)
    return run


def _addmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta: float = 1,
           alpha: float = 1) -> torch.Tensor:
    return exact_addmm(bias, a, b, beta=beta, alpha=alpha)


# operator -> exact kernel (applied when its first argument is a floating-point tensor)
KERNELS: dict[Any, Any] = {
    aten.mm.default: exact_mm,
    aten.addmm.default: _addmm,
    aten.bmm.default: exact_bmm,
    aten._softmax.default: _softmax,
    aten._log_softmax.default: _log_softmax,
    aten.logsumexp.default: exact_logsumexp,
    aten.mean.dim: _reduction(tree_mean),
    aten.sum.dim_IntList: _reduction(tree_sum),
    aten.sum.default: lambda x, *, dtype=None: tree_sum(x, None, dtype=dtype),
    aten.mean.default: lambda x, *, dtype=None: tree_mean(x, None, dtype=dtype),
    aten.silu.default: exact_silu,
    aten.sigmoid.default: exact_sigmoid,
}

# operators that reduce in an order of their own and have no exact kernel here
REFUSED: frozenset[str] = frozenset({
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_attention_math", "_flash_attention_forward",
    "_efficient_attention_forward", "_grouped_mm", "_scaled_grouped_mm", "_scaled_mm",
    "baddbmm", "addbmm", "addmv", "mv", "dot", "native_layer_norm", "_fused_rms_norm",
    "var", "var_mean", "std", "std_mean", "linalg_vector_norm", "convolution"})


def _in_gradient_formula() -> bool:
    """True while autograd runs a backward formula (grad mode is off there): gradients need not
    be batch-invariant, so they take the ordinary (faster) kernels. A forward recomputed in
    backward (activation checkpointing) runs with grad mode on and stays exact: its MoE routes
    and activations are the forward's."""
    return not torch.is_grad_enabled() and torch._C._current_graph_task_id() != -1


class ExactMode(TorchDispatchMode):
    """The dispatch mode behind `exact_kernels`."""

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if _SUSPENDED or _in_gradient_formula():
            return func(*args, **kwargs)
        kernel = KERNELS.get(func)
        if kernel is not None and args and _float(args[0]):
            return kernel(*args, **kwargs)
        name = func.overloadpacket.__name__
        if name in REFUSED and any(_float(a) for a in args):
            raise ExactKernelError(
                f"{name} ran inside graft-exact's kernels and has no exact kernel (its "
                f"reduction order depends on the batch); this model path is not supported "
                f"with features.exact.enabled=true")
        return func(*args, **kwargs)


_ACTIVE: list[bool] = []
_SUSPENDED: list[bool] = []


@contextmanager
def exact_kernels(enabled: bool = True) -> Iterator[None]:
    """Run the block with the exact kernels (nothing changes when ``enabled`` is false or when
    already inside)."""
    if not enabled or _ACTIVE:
        yield
        return
    _ACTIVE.append(True)
    try:
        with ExactMode():
            yield
    finally:
        _ACTIVE.pop()


def exact_active() -> bool:
    """True inside `exact_kernels` (callers with fused kernels of their own take the eager
    path there, which the mode makes exact)."""
    return bool(_ACTIVE)


@contextmanager
def ordinary_kernels() -> Iterator[None]:
    """Inside `exact_kernels`, run the block with the ordinary kernels (a gradient that need
    not be batch-invariant, through operators the exact mode refuses); a no-op outside."""
    _SUSPENDED.append(True)
    try:
        yield
    finally:
        _SUSPENDED.pop()
