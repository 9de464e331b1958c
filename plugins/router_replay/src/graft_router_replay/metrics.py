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
    fell back to native routing, and the bytes the routes take."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.reset()

    def reset(self) -> None:
        """Start a new step."""
        self.totals = torch.zeros(len(_NAMES), dtype=torch.float64, device=self.device)

    def add_layer(self, native_ids: torch.Tensor, replayed_ids: torch.Tensor,
                  replayed: torch.Tensor, fallback: torch.Tensor) -> None:
        """One router in one replayed forward: ``native_ids`` / ``replayed_ids`` ``(N, k)``,
        ``replayed`` ``(N,)`` rows that replayed, ``fallback`` ``(N,)`` real rows that routed
        natively."""
        found = (replayed_ids[:, :, None] == native_ids[:, None, :]).any(dim=-1)
        mismatched = (~found & replayed[:, None]).sum()
        choices = replayed.sum() * replayed_ids.shape[1]
        real = replayed.sum() + fallback.sum()
        self.totals[:4] += torch.stack([mismatched, choices, fallback.sum(), real]).double()

    def add_storage(self, bytes_per_token: int, tokens: torch.Tensor) -> None:
        """A replayed micro-batch's ``tokens`` real tokens, each holding ``bytes_per_token``."""
        self.totals[4:] += torch.stack([tokens * bytes_per_token, tokens]).double()

    def metrics(self) -> dict[str, float]:
        """The step's metrics, summed over all ranks (call on every rank).

        ``mismatch_fraction``: share of replayed (token, layer, k) choices where the router's own
        top-k did not contain the replayed expert. ``fallback_rows``: share of real token rows
        (per MoE layer) routed natively. ``bytes_per_token``: bytes of stored routes per token.
        All 0 in a step that replayed nothing (R2 on-policy: the update records nothing).
        """
        totals = self.totals.clone()
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(totals)
        mismatched, choices, fallback, real, route_bytes, tokens = totals.tolist()
        return {PREFIX + "mismatch_fraction": mismatched / choices if choices else 0.0,
                PREFIX + "fallback_rows": fallback / real if real else 0.0,
                PREFIX + "bytes_per_token": route_bytes / tokens if tokens else 0.0}
