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
quantised where it is (expert tensors, split by expert, always are); otherwise the full weight
is gathered once per step, quantised, and this rank's slice kept.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

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
    """This rank's part of the fake-quantised weight, in the parameter's dtype."""
    param = weight.param
    if not _is_dtensor(param):
        return weight.fake_quant(param.detach().to(torch.bfloat16)).to(param.dtype)
    if shard_holds_whole_tiles(param, weight.tile_rows):
        local = param.to_local().detach()
        return weight.fake_quant(local.to(torch.bfloat16)).to(param.dtype)
    from torch.distributed.tensor import distribute_tensor

    full = weight.fake_quant(param.full_tensor().detach().to(torch.bfloat16)).to(param.dtype)
    return distribute_tensor(full, param.device_mesh, param.placements,
                             src_data_rank=None).to_local()


def shard_holds_whole_tiles(param: torch.Tensor, tile_rows: int) -> bool:
    """True when every shard of a DTensor ``param`` is a whole number of tiles: replicated, or
    split along dim 0 on a 1-D mesh into chunks (``torch.chunk`` sizes) of whole tile rows."""
    from torch.distributed.tensor import Replicate, Shard

    placements = param.placements
    if all(isinstance(p, Replicate) for p in placements):
        return True
    if len(placements) != 1 or not isinstance(placements[0], Shard) or placements[0].dim != 0:
        return False
    world = param.device_mesh.size()
    chunk = -(-param.shape[0] // world)
    return chunk % tile_rows == 0


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
