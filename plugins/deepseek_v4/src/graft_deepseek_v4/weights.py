"""Fake-quantised weights, computed once per optimizer step and swapped in place.

A weight does not change between two optimizer steps, so its fake-quantised value is computed
once, at the first forward after a step (the rollout, the log-prob passes and every micro-batch
and activation-checkpoint recompute of the update then read the same values), and written into
the parameter's own storage: FSDP2 all-gathers the quantised values like any parameter, with no
extra memory for the unsharded weights. The gradient computed there is the gradient of the layer
at the quantised weight: the straight-through estimate. Right before the optimizer step the
master values (kept, sharded, in a copy) are put back, so AdamW updates the masters; the next
forward quantises again. A frozen model (the KL reference) is quantised once and keeps no masters.

Tiles are computed on whole tiles: a shard whose rows start and end on tile boundaries is
quantised where it is, with no communication (FSDP2's row shards of a weight whose rows split
into whole 128-row tiles per rank, on 1-D or multi-dim meshes; stacked experts, tiled per
expert, whenever each shard holds whole experts); otherwise the full weight is gathered once per
step, quantised, and this rank's slice kept.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate

import torch

FakeQuant = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class QuantizedWeight:
    """A parameter (``module.<attr>``, looked up when used: sharding replaces parameter
    objects) and how to fake-quantise it: ``fake_quant`` maps the full bf16 tensor to its
    dequantised bf16 value; ``tile_rows`` is the tile height along dim 0 (1 for stacked experts,
    whose dim 0 is the expert)."""

    name: str
    module: torch.nn.Module
    attr: str
    fake_quant: FakeQuant
    tile_rows: int
    master: torch.Tensor | None = field(default=None, repr=False)

    @property
    def param(self) -> torch.nn.Parameter:
        """The parameter as it is now (plain, or FSDP2's DTensor)."""
        return getattr(self.module, self.attr)


class WeightQuantizer:
    """The fake-quantised weights of one model: `quantize` (idempotent until `restore`)."""

    def __init__(self, weights: Sequence[QuantizedWeight], *, keep_masters: bool) -> None:
        self.weights = list(weights)
        self.keep_masters = keep_masters
        self.active = False
        self.passes = 0  # quantisation passes so far (one per optimizer step)
        self.reported = 0  # passes already reported in step metrics

    @torch.no_grad()
    def quantize(self) -> None:
        """Write every weight's fake-quantised value into its storage, keeping the master."""
        if self.active:
            return
        for weight in self.weights:
            local = _local(weight.param)
            if self.keep_masters:
                weight.master = local.clone()
            local.copy_(quantized_local(weight))
        self.active = True
        self.passes += 1

    @torch.no_grad()
    def requantize(self) -> None:
        """Quantise again: the weights were overwritten from outside with new master values
        (rollout's decode copy, refreshed from the trained policy after every update)."""
        self.active = False
        self.quantize()

    @torch.no_grad()
    def restore(self) -> None:
        """Put the master values back (before the optimizer step); no-op when not quantised or
        for a frozen model, whose quantised values stay."""
        if not self.active or not self.keep_masters:
            return
        for weight in self.weights:
            _local(weight.param).copy_(weight.master)
            weight.master = None
        self.active = False

    def owns_any(self, params: Sequence[torch.Tensor]) -> bool:
        """True when one of ``params`` is a weight of this quantizer."""
        ours = {id(w.param) for w in self.weights}
        return any(id(p) in ours for p in params)


def _local(param: torch.Tensor) -> torch.Tensor:
    return param.to_local() if _is_dtensor(param) else param


def _is_dtensor(tensor: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def quantized_local(weight: QuantizedWeight) -> torch.Tensor:
    """This rank's part of the fake-quantised weight, in the parameter's dtype: its own shard
    quantised where it is when the shards hold whole tiles (`shard_holds_whole_tiles`), else
    sliced from the quantised full weight (`quantized_by_gathering`)."""
    param = weight.param
    if not _is_dtensor(param):
        return weight.fake_quant(param.detach().to(torch.bfloat16)).to(param.dtype)
    if shard_holds_whole_tiles(param, weight.tile_rows):
        local = param.to_local().detach()
        return weight.fake_quant(local.to(torch.bfloat16)).to(param.dtype)
    return quantized_by_gathering(weight)


def quantized_by_gathering(weight: QuantizedWeight) -> torch.Tensor:
    """This rank's slice of the fake quant of the whole weight, gathered from every shard (a
    collective over the parameter's mesh)."""
    from torch.distributed.tensor import distribute_tensor

    param = weight.param
    full = weight.fake_quant(param.full_tensor().detach().to(torch.bfloat16)).to(param.dtype)
    return distribute_tensor(full, param.device_mesh, param.placements,
                             src_data_rank=None).to_local()


def shard_holds_whole_tiles(param: torch.Tensor, tile_rows: int) -> bool:
    """True when every shard of a DTensor ``param`` is whole rows of tiles, so each rank can
    quantise its own: every placement is ``Replicate`` or ``Shard(0)``, on a mesh of any number
    of dims (FSDP2, HSDP's replicate x shard, expert shards split further), and every point
    where dim 0 is split (``torch.chunk`` sizes, mesh dims in order) is a multiple of
    ``tile_rows``. Reads only the shape and the mesh, so every rank answers the same (the other
    case gathers: a collective)."""
    from torch.distributed.tensor import Replicate, Shard

    pieces = [param.shape[0]]  # dim 0 as the shards split it, in order
    for mesh_dim, placement in enumerate(param.placements):
        if isinstance(placement, Replicate):
            continue
        if type(placement) is not Shard or placement.dim != 0:  # columns, strided, partial
            return False
        parts = param.device_mesh.size(mesh_dim)
        pieces = [size for length in pieces for size in _chunk_sizes(length, parts)]
    return all(boundary % tile_rows == 0 for boundary in accumulate(pieces[:-1]))


def _chunk_sizes(length: int, parts: int) -> list[int]:
    """The sizes ``torch.chunk`` (DTensor's ``Shard``) splits ``length`` into over ``parts``."""
    size = -(-length // parts)
    return [max(0, min(size, length - index * size)) for index in range(parts)]


# Live policy quantizers; the optimizer step pre-hook restores their masters.
_POLICIES: weakref.WeakSet[WeightQuantizer] = weakref.WeakSet()
_HOOK: list[object] = []


def restore_before_optimizer_steps(quantizer: WeightQuantizer) -> None:
    """Have every optimizer step put ``quantizer``'s masters back first (for the optimizers that
    hold its weights), through torch's global optimizer step pre-hook (registered once)."""
    _POLICIES.add(quantizer)
    if not _HOOK:
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        _HOOK.append(register_optimizer_step_pre_hook(_restore_masters))


def _restore_masters(optimizer: torch.optim.Optimizer, args: object, kwargs: object) -> None:
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for quantizer in list(_POLICIES):
        if quantizer.active and quantizer.owns_any(params):
            quantizer.restore()


def live_policies() -> list[WeightQuantizer]:
    """The weight quantizers of the trained models alive in this process."""
    return list(_POLICIES)


def step_metrics() -> dict[str, float]:
    """At the end of a step: every live policy quantizer's masters back in place (checkpoints
    and exports read masters) and ``deepseek_v4/qat_weight_passes``, the weight quantisation
    passes since the last call (one per optimizer step); {} without QAT."""
    live = list(_POLICIES)
    if not live:
        return {}
    passes = 0
    for quantizer in live:
        quantizer.restore()
        passes += quantizer.passes - quantizer.reported
        quantizer.reported = quantizer.passes
    return {"deepseek_v4/qat_weight_passes": float(passes)}
