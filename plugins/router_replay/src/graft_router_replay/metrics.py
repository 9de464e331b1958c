"""Per-step replay statistics, summed over micro-batches and ranks.

Counted in the update passes only (the ones the issue's metrics describe), once per router per
micro-batch (a checkpoint recompute of the same forward is not counted again). Counts stay on
the device until the step ends, so the hot path never synchronises.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

PREFIX = "router_replay/"
_NAMES = ("mismatched", "choices", "fallback_rows", "real_rows", "route_bytes", "route_tokens")


class ReplayCounters:
    """Counts of one step: replayed choices, how many differ from native routing, rows that
    fell back to native routing, and the bytes the routes take.

    The counts live on the device of the tensors they count (the forward's), created at the
    first count of a step: nothing is decided from the model's parameters, which a model built
    from ``model.path`` holds on the meta device until it is sharded and filled.
    """

    def __init__(self, reduce_device: torch.device | None = None) -> None:
        """``reduce_device``: where the step's counts are summed over ranks (the process group's
        device: CPU for gloo, the rank's GPU for NCCL); None: where they were counted."""
        self.reduce_device = reduce_device
        self.reset()

    def reset(self) -> None:
        """Start a new step."""
        self.totals: torch.Tensor | None = None

    def add_layer(self, native_ids: torch.Tensor, replayed_ids: torch.Tensor,
                  replayed: torch.Tensor, fallback: torch.Tensor) -> None:
        """One router in one replayed forward: ``native_ids`` / ``replayed_ids`` ``(N, k)``,
        ``replayed`` ``(N,)`` rows that replayed, ``fallback`` ``(N,)`` real rows that routed
        natively."""
        found = (replayed_ids[:, :, None] == native_ids[:, None, :]).any(dim=-1)
        mismatched = (~found & replayed[:, None]).sum()
        choices = replayed.sum() * replayed_ids.shape[1]
        real = replayed.sum() + fallback.sum()
        self._add(0, torch.stack([mismatched, choices, fallback.sum(), real]))

    def add_storage(self, bytes_per_token: int, tokens: torch.Tensor) -> None:
        """A replayed micro-batch's ``tokens`` real tokens, each holding ``bytes_per_token``."""
        self._add(4, torch.stack([tokens * bytes_per_token, tokens]))

    def _add(self, start: int, values: torch.Tensor) -> None:
        if self.totals is None:
            self.totals = torch.zeros(len(_NAMES), dtype=torch.float64, device=values.device)
        self.totals[start:start + len(values)] += values.double()

    def metrics(self) -> dict[str, float]:
        """The step's metrics, summed over all ranks (call on every rank).

        ``mismatch_fraction``: share of replayed (token, layer, k) choices where the router's own
        top-k did not contain the replayed expert. ``fallback_rows``: share of real token rows
        (per MoE layer) routed natively. ``bytes_per_token``: bytes of stored routes per token.
        All 0 in a step that replayed nothing (R2 on-policy: the update records nothing).
        """
        device = self.reduce_device or (self.totals.device if self.totals is not None
                                        else torch.device("cpu"))
        totals = (torch.zeros(len(_NAMES), dtype=torch.float64, device=device)
                  if self.totals is None else self.totals.to(device, copy=True))
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(totals)
        mismatched, choices, fallback, real, route_bytes, tokens = totals.tolist()
        return {PREFIX + "mismatch_fraction": mismatched / choices if choices else 0.0,
                PREFIX + "fallback_rows": fallback / real if real else 0.0,
                PREFIX + "bytes_per_token": route_bytes / tokens if tokens else 0.0}
