"""Expert parallelism for transformers' fused MoE experts: shard, dispatch, compute, combine.

Model-family plugins that support ``engine.ep_size > 1`` compose these helpers in their
``parallelize`` (see `graft.engine.distributed.parallelize.apply_fsdp` for the sharding that follows):

* `shard_experts` splits every per-expert parameter of an experts module along dim 0 over the
  mesh's ``ep`` dimension (a DTensor ``Shard(0)``): each rank keeps ``num_experts / ep`` experts.
* `dispatch_tokens` sends every (token, chosen expert) pair to the rank holding that expert with
  one all-to-all, grouped by local expert; `combine_tokens` sends the expert outputs back with a
  second all-to-all and sums them with the routing weights. Both are differentiable.
* `apply_expert_parallel` does all of it for a module following transformers' experts
  convention (``@use_experts_implementation``: ``gate_up_proj``/``down_proj`` with optional
  biases, ``is_transposed``, ``_apply_gate``): its forward becomes dispatch -> one grouped GEMM
  per projection over the local experts -> combine. A hand-written expert-parallel forward
  reads its weights through `expert_weight` (what a plugin's adapted experts compute with) and
  `local_expert_weight` (the gradient scale FSDP2 needs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import MethodType
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from graft.errors import ConfigError


@dataclass(frozen=True)
class DispatchPlan:
    """How `dispatch_tokens` moved the (token, expert) pairs, so `combine_tokens` can undo it.

    ``slot_order`` sorts the ``tokens x top_k`` slots by expert; ``send_splits``/``recv_splits``
    are the all-to-all row counts per ep rank; ``local_order`` groups received rows by local
    expert.
    """

    slot_order: torch.Tensor
    send_splits: list[int]
    recv_splits: list[int]
    local_order: torch.Tensor
    num_tokens: int
    top_k: int
    group: dist.ProcessGroup


def _all_to_all(rows: torch.Tensor, *, send: list[int], recv: list[int],
                group: dist.ProcessGroup) -> torch.Tensor:
    from torch.distributed._functional_collectives import all_to_all_single_autograd

    return all_to_all_single_autograd(rows.contiguous(), recv, send, group)


def dispatch_tokens(hidden: torch.Tensor, expert_ids: torch.Tensor, *, num_experts: int,
                    group: dist.ProcessGroup) -> tuple[torch.Tensor, list[int], DispatchPlan]:
    """Send each token to the ranks of its chosen experts (``group`` = the ``ep`` group).

    ``hidden`` is ``(T, H)``, ``expert_ids`` ``(T, top_k)`` global expert ids; experts are split
    in equal consecutive blocks over the group's ranks. Returns the received rows grouped by
    local expert, the number of rows per local expert, and the plan for `combine_tokens`.
    One collective exchanges the counts (a host sync), one moves the rows.
    """
    ep = dist.get_world_size(group)
    local_experts = num_experts // ep
    num_tokens, top_k = expert_ids.shape
    flat = expert_ids.reshape(-1)
    slot_order = torch.argsort(flat, stable=True)
    send_rows = hidden[slot_order // top_k]
    per_expert = torch.bincount(flat, minlength=num_experts)
    recv_per_expert = torch.empty_like(per_expert)
    dist.all_to_all_single(recv_per_expert, per_expert, group=group)
    counts = torch.stack([per_expert, recv_per_expert]).view(2, ep, local_experts).cpu()
    send_splits, recv_splits = counts.sum(-1).tolist()
    received = _all_to_all(send_rows, send=send_splits, recv=recv_splits, group=group)
    # Received rows come per source rank, each sorted by local expert: regroup by local expert.
    local_ids = torch.arange(local_experts).repeat(ep)
    row_expert = torch.repeat_interleave(local_ids, counts[1].reshape(-1)).to(hidden.device)
    local_order = torch.argsort(row_expert, stable=True)
    plan = DispatchPlan(slot_order, send_splits, recv_splits, local_order, num_tokens, top_k,
                        group)
    return received[local_order], counts[1].sum(0).tolist(), plan


def _inverse(order: torch.Tensor) -> torch.Tensor:
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device)
    return inverse


def combine_tokens(expert_out: torch.Tensor, plan: DispatchPlan,
                   weights: torch.Tensor) -> torch.Tensor:
    """Return expert outputs to their tokens and sum them with ``weights`` ``(T, top_k)``."""
    by_source = expert_out[_inverse(plan.local_order)]
    back = _all_to_all(by_source, send=plan.recv_splits, recv=plan.send_splits,
                       group=plan.group)
    slots = back[_inverse(plan.slot_order)]
    weighted = slots.view(plan.num_tokens, plan.top_k, -1) * weights.unsqueeze(-1).to(slots.dtype)
    return weighted.sum(dim=1)


def grouped_linear(rows: torch.Tensor, weight: torch.Tensor, counts: Sequence[int], *,
                   transposed: bool, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``rows`` (grouped by expert, ``counts[e]`` rows for expert ``e``) times each expert's
    ``weight[e]`` (``(E, in, out)`` when ``transposed``, else ``(E, out, in)``), plus ``bias[e]``.

    One grouped GEMM on CUDA (``torch._grouped_mm``, bf16); a loop over experts elsewhere.
    """
    matrices = weight if transposed else weight.transpose(-2, -1)
    if rows.is_cuda and rows.dtype == torch.bfloat16 and hasattr(torch, "_grouped_mm"):
        offsets = torch.tensor(counts, device=rows.device).cumsum(0).to(torch.int32)
        out = torch._grouped_mm(rows, matrices, offs=offsets)
    else:
        parts = [part @ matrices[e] for e, part in enumerate(rows.split(list(counts)))]
        out = torch.cat(parts) if parts else rows.new_empty((0, matrices.shape[-1]))
    if bias is not None:
        out = out + torch.repeat_interleave(bias, torch.tensor(counts, device=bias.device), dim=0)
    return out


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; the gradient scaled by ``scale`` on its way back."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.scale, None


def local_expert_weight(param: torch.Tensor | None, ep: int) -> torch.Tensor | None:
    """This rank's block of an expert parameter, for an expert-parallel forward.

    Its gradient is divided by ``ep``: a block's gradient sums the tokens of all ``ep`` ranks of
    the group, and FSDP2 then averages it over the ``efsdp`` ranks only, so without this it
    would be ``ep`` times the data-parallel average every other gradient is.
    """
    if param is None:
        return None
    local = param.to_local() if hasattr(param, "to_local") else param
    return _ScaleGrad.apply(local, 1.0 / ep) if ep > 1 else local


def expert_weight(experts: torch.nn.Module, name: str) -> torch.Tensor | None:
    """The weight ``name`` of ``experts`` as its computation uses it: what the module's own
    ``expert_weight(name)`` returns where it defines one (a plugin's adapted experts: the
    weight merged with its adapters), else the attribute (None when it has none). An
    expert-parallel forward, installed on the instance, bypasses the forward a subclass
    defines, so it reads its weights through this."""
    read = getattr(experts, "expert_weight", None)
    return read(name) if read is not None else getattr(experts, name, None)


def expert_parameter_names(experts: torch.nn.Module, num_experts: int) -> list[str]:
    """Names of ``experts``' own parameters that hold one slice per expert along dim 0."""
    return [name for name, param in experts.named_parameters(recurse=False)
            if param.dim() >= 1 and param.shape[0] == num_experts]


def shard_experts(experts: torch.nn.Module, ep_mesh: DeviceMesh, *, num_experts: int) -> None:
    """Replace each per-expert parameter of ``experts`` by a DTensor ``Shard(0)`` over
    ``ep_mesh`` (``meshes["ep"]``; every rank keeps its block of the values it holds, no
    communication)."""
    from torch.distributed.tensor import Shard, distribute_tensor

    ep = ep_mesh.size()
    if num_experts % ep:
        raise ConfigError(f"engine.ep_size={ep} must divide the number of experts "
                          f"({num_experts}) of {type(experts).__name__}")
    for name in expert_parameter_names(experts, num_experts):
        param = getattr(experts, name)
        sharded = distribute_tensor(param.detach(), ep_mesh, [Shard(0)], src_data_rank=None)
        setattr(experts, name, torch.nn.Parameter(sharded, requires_grad=param.requires_grad))


def _expert_parallel_forward(self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                             top_k_weights: torch.Tensor) -> torch.Tensor:
    group = self.graft_ep_group
    ep = dist.get_world_size(group)
    rows, counts, plan = dispatch_tokens(hidden_states, top_k_index,
                                         num_experts=self.num_experts, group=group)
    up = "gate_up_proj" if self.has_gate else "up_proj"
    weight = lambda name: local_expert_weight(expert_weight(self, name), ep)  # noqa: E731
    out = grouped_linear(rows, weight(up), counts, transposed=self.is_transposed,
                         bias=weight(f"{up}_bias") if self.has_bias else None)
    out = self._apply_gate(out) if self.has_gate else self.act_fn(out)
    out = grouped_linear(out, weight("down_proj"), counts, transposed=self.is_transposed,
                         bias=weight("down_proj_bias") if self.has_bias else None)
    return combine_tokens(out, plan, top_k_weights).to(hidden_states.dtype)


def apply_expert_parallel(experts: torch.nn.Module, ep_mesh: DeviceMesh) -> None:
    """Shard a transformers experts module over ``ep_mesh`` and make its forward dispatch
    tokens to the experts' ranks (all-to-all), run the local experts as grouped GEMMs, and
    combine the results (all-to-all back).

    The module must follow transformers' experts convention (``num_experts``, ``has_gate``,
    ``has_bias``, ``is_transposed``, ``gate_up_proj``/``up_proj``, ``down_proj``); call it
    before `graft.engine.distributed.parallelize.apply_fsdp` shards the expert blocks over ``efsdp``
    (``expert_modules``, ``expert_mesh=meshes["efsdp"]``).
    """
    missing = [a for a in ("num_experts", "has_gate", "has_bias", "is_transposed", "down_proj")
               if not hasattr(experts, a)]
    if missing:
        raise TypeError(f"{type(experts).__name__} does not follow transformers' experts "
                        f"convention (missing {', '.join(missing)}); write an expert-parallel "
                        f"forward for it with dispatch_tokens / combine_tokens")
    shard_experts(experts, ep_mesh, num_experts=experts.num_experts)
    experts.graft_ep_group = ep_mesh.get_group()
    experts.forward = MethodType(_expert_parallel_forward, experts)
