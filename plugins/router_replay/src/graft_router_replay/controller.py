"""The per-micro-batch state machine on the trainer's routers: disabled, record or replay.

It knows no shapes beyond a flat token dimension: the session arms it with targets already laid
out like the forward's tokens (the engine's packing and ``pad_to_length``), and reads back what
it recorded. Hooks are keyed by router, so a checkpoint recompute (which fires routers again,
in reverse block order, during backward) replays the same layer's targets; a router that fires
twice in one armed forward records once and is counted once.
"""

from __future__ import annotations

import enum
from typing import Any

import torch

from graft_router_replay.layers import RouterMap, RouterSlot
from graft_router_replay.metrics import ReplayCounters
from graft_router_replay.routes import RouteError


class State(enum.Enum):
    """What the routers do in the current forward."""

    DISABLED = "disabled"  # native routing, nothing kept
    RECORD = "record"  # native routing, every router's ids kept
    REPLAY = "replay"  # the armed targets' experts, weights recomputed from the router's logits


class ReplayController:
    """Forward hooks on every router of a `RouterMap`, switched per micro-batch."""

    def __init__(self, routers: RouterMap, counters: ReplayCounters) -> None:
        self.routers = routers
        self.counters = counters
        self.state = State.DISABLED
        self.recorded: dict[int, torch.Tensor] = {}
        self.fired: set[int] = set()
        self.targets: torch.Tensor | None = None  # (N, layers, k) int16
        self.native: torch.Tensor | None = None  # (N, layers) bool
        self.real: torch.Tensor | None = None  # (N,) bool
        self.count = False
        self.handles = [slot.router.register_forward_hook(self._hook(slot))
                        for slot in routers.slots]

    def disable(self) -> None:
        """Route natively from the next forward on."""
        self.state = State.DISABLED
        self.targets = self.native = self.real = None

    def record(self) -> None:
        """Keep every router's ids in the next forward."""
        self.disable()
        self.state = State.RECORD
        self.recorded = {}

    def take_recorded(self) -> torch.Tensor:
        """``(N, layers, k)`` ids the last recorded forward used; every router must have fired."""
        missing = sorted(set(range(self.routers.num_layers)) - set(self.recorded))
        if missing:
            raise RouteError(f"MoE layers at positions {missing} did not route during the "
                             f"recorded forward; routes need every layer of "
                             f"family.router_modules")
        recorded = torch.stack([self.recorded[p] for p in range(self.routers.num_layers)], dim=1)
        self.recorded = {}
        return recorded

    def replay(self, targets: torch.Tensor, native: torch.Tensor, real: torch.Tensor, *,
               count: bool) -> None:
        """Force ``targets`` ``(N, layers, k)`` in the next forward (and its recompute), except
        on ``native`` ``(N, layers)`` rows; ``real`` ``(N,)`` marks sample tokens (not pad);
        ``count``: add this forward to the step's metrics."""
        expected = (self.routers.num_layers, self.routers.top_k)
        if targets.dim() != 3 or tuple(targets.shape[1:]) != expected:
            raise RouteError(f"routes of shape {tuple(targets.shape)} do not fit the model: "
                             f"expected (tokens, {expected[0]} MoE layers, top-{expected[1]})")
        self.state = State.REPLAY
        self.targets, self.native, self.real, self.count = targets, native, real, count
        self.fired = set()

    def check_replayed(self) -> None:
        """After a replayed forward: the routers that fired are exactly the recorded layers."""
        if self.state is State.REPLAY and self.fired != self.routers.learned_positions:
            missing = sorted(self.routers.learned_positions - self.fired)
            raise RouteError(f"MoE layers at positions {missing} did not route during a "
                             f"replayed forward, so their recorded routes were not used")

    def remove(self) -> None:
        """Take the hooks off the routers."""
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def _hook(self, slot: RouterSlot) -> Any:
        def on_router(module: torch.nn.Module, args: Any, output: Any) -> Any:
            if self.state is State.RECORD:
                self.recorded.setdefault(slot.position, output[2].detach())
                return None
            if self.state is State.REPLAY and not slot.static:
                return self._replayed(slot, output)
            return None

        return on_router

    def _replayed(self, slot: RouterSlot, output: Any) -> tuple[Any, ...]:
        logits, weights, ids = output[:3]
        targets = self.targets[:, slot.position]
        if targets.shape[0] != ids.shape[0]:
            raise RouteError(f"the router at MoE position {slot.position} routes {ids.shape[0]} "
                             f"tokens but its replay targets hold {targets.shape[0]}")
        native = self.native[:, slot.position]
        new_ids = torch.where(native[:, None], ids, targets.to(ids.dtype))
        recomputed = self.routers.routing_weights(slot.router, logits, new_ids)
        new_weights = torch.where(native[:, None], weights, recomputed)
        if self.count and slot.position not in self.fired:
            self.counters.add_layer(ids, new_ids, ~native & self.real, native & self.real)
        self.fired.add(slot.position)
        return (logits, new_weights, new_ids, *output[3:])
