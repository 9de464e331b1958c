"""Sequence parallelism's data path: every row split by sequence over the ``sp`` ranks.

A plugin provides the size (``graft_parallel_dims`` returning ``{"sp": n}``: graft-ulysses) and
makes attention see whole rows; the core does the rest, the same for any such plugin:

1. the ``sp`` ranks of one data-parallel rank train on the same data (`ParallelDims`: data is
   split over ``dp`` only);
2. every row is padded to a multiple of ``sp`` (with ``pad_to_length``: of its bucket too)
   *before* the split, so the pad is an ordinary pad segment: loss mask 0, unpadded by
   ``layout.unpad`` like any other;
3. ``graft_prepare_inputs`` sees whole rows plus this rank's `SequenceShard`; then every
   per-token tensor is cut to this rank's columns ``[rank * L/sp, (rank + 1) * L/sp)`` of every
   row (position ids stay global: ``shard.position_ids`` keeps the whole rows', from which
   packed-row boundaries, ``cu_seqlens``, follow);
4. the forward runs inside `sequence_split`, where `active_shard` gives the plugin's attention
   the shard (group, whole-row positions); outside it (rollout, a plain forward) it is None;
5. log-probs (with their gradient: backward keeps this rank's part), entropy and the tensors
   plugins keep (``graft_post_forward``) are gathered into whole rows once; the loss is then
   computed on whole rows on every ``sp`` rank, exactly as without sequence parallelism, so
   every ``loss_agg_mode`` normalises over the whole sequence;
6. each ``sp`` rank back-propagates only its part of the rows, and FSDP2 averages gradients
   over all ``dp x sp`` ranks, so the loss is scaled by ``sp`` for backward
   (`backward_scale`).

With ``sp == 1`` the shard is the whole row: `SequenceShard.local` returns its argument and
nothing is gathered or scaled.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from graft.errors import PluginError

if TYPE_CHECKING:
    import torch.distributed as dist

    from graft.config.schema import GraftConfig
    from graft.plugins import GraftPluginManager

# The dimensions a plugin may size through graft_parallel_dims.
PLUGIN_DIMS = ("sp",)


@dataclass(frozen=True, eq=False)
class SequenceShard:
    """The contiguous part of every row of a micro-batch that this rank's forward computes.

    ``rank`` of ``size`` sequence-parallel ranks (``group``, None when ``size`` is 1), for rows
    of ``row_length`` tokens (a multiple of ``size``). ``position_ids`` are the whole rows'
    ``(R, L)`` positions (global: a sample's positions run on across the cut), None when the
    shard was made without them; ``layout`` the micro-batch's
    `graft.engine.batch.micro_batch.PackedLayout` (where each sample sits), None when unknown.
    ``cache`` is scratch space for attention plugins (a mask or ``cu_seqlens`` built once per
    forward, not per layer); it lives as long as the shard.
    """

    rank: int
    size: int
    row_length: int
    group: dist.ProcessGroup | None = None
    position_ids: torch.Tensor | None = None
    layout: Any = None
    cache: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def one_sample_per_row(self) -> bool:
        """True when no row holds more than one sample (then a causal mask is exact for every
        real token: the trailing pad comes after it)."""
        if self.layout is None:
            return False
        rows = [segment.row for segment in self.layout.segments]
        return len(rows) == len(set(rows))

    @property
    def length(self) -> int:
        """Tokens of each row this rank computes: ``row_length / size``."""
        return self.row_length // self.size

    @property
    def start(self) -> int:
        """First column of every row that is this rank's."""
        return self.rank * self.length

    @property
    def stop(self) -> int:
        """One past the last column of every row that is this rank's."""
        return self.start + self.length

    @property
    def split(self) -> bool:
        """True when rows are split (``size`` > 1)."""
        return self.size > 1

    def local(self, per_token: torch.Tensor) -> torch.Tensor:
        """This rank's columns of a per-token ``(R, L, ...)`` tensor (the tensor itself when
        rows are not split)."""
        if not self.split:
            return per_token
        return per_token[:, self.start:self.stop]

    def gather(self, per_token: torch.Tensor) -> torch.Tensor:
        """The whole rows ``(R, L, ...)`` from every rank's ``(R, L / size, ...)`` part (a
        collective over ``group``). Differentiable: the gradient of the whole rows flows back
        to each rank's own part (every rank computes the same loss from the gathered rows)."""
        if not self.split:
            return per_token
        if per_token.is_floating_point():
            return _GatherRows.apply(per_token, self)
        # Integer and bool tensors (routes, flags) travel as bytes: gloo and NCCL lack some
        # integer types (int16), and no gradient flows through them.
        dtype = per_token.dtype
        as_bytes = per_token.contiguous().view(torch.uint8)
        return _gather_parts(as_bytes, self).view(dtype)


class _GatherRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, part: torch.Tensor, shard: SequenceShard) -> torch.Tensor:
        ctx.shard = shard
        return _gather_parts(part, shard)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        shard = ctx.shard
        return grad[:, shard.start:shard.stop].contiguous(), None


def _gather_parts(part: torch.Tensor, shard: SequenceShard) -> torch.Tensor:
    import torch.distributed as dist

    part = part.contiguous()
    parts = [torch.empty_like(part) for _ in range(shard.size)]
    dist.all_gather(parts, part, group=shard.group)
    return torch.cat(parts, dim=1)


_active: list[SequenceShard] = []


@contextmanager
def sequence_split(shard: SequenceShard) -> Iterator[SequenceShard]:
    """Within the block, `active_shard` is ``shard``: a forward over this rank's part of the
    rows is running (the engine's split forward)."""
    _active.append(shard)
    try:
        yield shard
    finally:
        _active.pop()


def active_shard() -> SequenceShard | None:
    """The `SequenceShard` of the split forward running now, or None (no split forward: the
    rollout's generation, a forward on whole rows). Attention plugins read it to decide whether
    to span the ``sp`` ranks."""
    return _active[-1] if _active else None


def row_multiple(pad_bucket: int | None, sp: int) -> int | None:
    """What every row's length must be a multiple of: ``pad_to_length``'s bucket (None: off)
    and, with sequence parallelism, ``sp`` (their least common multiple)."""
    if sp <= 1:
        return pad_bucket
    return math.lcm(pad_bucket or 1, sp)


def split_tensors(tensors: Mapping[str, torch.Tensor],
                  shard: SequenceShard) -> dict[str, torch.Tensor]:
    """Every per-token tensor cut to ``shard``'s columns."""
    return {name: shard.local(tensor) for name, tensor in tensors.items()}


def backward_scale(shard: SequenceShard) -> float:
    """What a loss computed on whole rows is multiplied by before backward: ``sp``. Each rank
    back-propagates only its part of the rows and FSDP2 averages over all ``dp x sp`` ranks;
    the factor turns the average over a row's parts back into their sum."""
    return float(shard.size)


def sequence_parallel_size(*, cfg: GraftConfig, manager: GraftPluginManager | None = None) -> int:
    """The run's sequence-parallel size: what the plugins' ``graft_parallel_dims`` give for
    ``sp`` (1 when none does) for the root config ``cfg``. Two plugins sizing one dimension,
    or a dimension the core does not lay out, is a `PluginError` naming the plugins."""
    from graft.plugins import get_plugin_manager

    manager = manager or get_plugin_manager()
    hook = manager.hook.graft_parallel_dims
    sizes: dict[str, tuple[str, int]] = {}
    for impl in hook.get_hookimpls():
        others = [i.plugin for i in hook.get_hookimpls() if i is not impl]
        results = manager.pm.subset_hook_caller(hook.name, remove_plugins=others)(cfg=cfg)
        for name, size in ((results[0] if results else None) or {}).items():
            if name not in PLUGIN_DIMS:
                raise PluginError(f"plugin {impl.plugin_name!r}: graft_parallel_dims sizes "
                                  f"{name!r}; plugins size only {', '.join(PLUGIN_DIMS)}")
            if name in sizes and int(size) > 1 and sizes[name][1] > 1:
                raise PluginError(f"plugins {sizes[name][0]!r} and {impl.plugin_name!r} both "
                                  f"set the {name} size; enable only one of them")
            if name not in sizes or int(size) > 1:
                sizes[name] = (impl.plugin_name, int(size))
    return sizes.get("sp", ("", 1))[1]
