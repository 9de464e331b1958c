"""Which routers a model has, where each sits, and what routing replay needs from its family.

Routes have one slot per router of ``family.router_modules(model)`` (layer order), so a route's
layer position names the same router in every pass, in checkpoint recompute and in an engine's
per-decoder-layer output. Routers that pick experts without learned weights (the family's
``static_routing``: DeepSeek-V4's hash routers) keep their slot but are never replayed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from graft.errors import ConfigError
from graft_router_replay.routes import MAX_EXPERTS

RoutingWeights = Callable[[torch.nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]

# Hugging Face config fields that hold the expert count / experts per token, by model family.
_EXPERT_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts")
_TOP_K_FIELDS = ("num_experts_per_tok", "top_k")


@dataclass(frozen=True)
class RouterSlot:
    """One router: its ``position`` in the routes' layer dimension, the decoder block it belongs
    to (``decoder_layer``), the module, and whether it routes without learned weights."""

    position: int
    decoder_layer: int
    router: torch.nn.Module
    static: bool


@dataclass(frozen=True)
class RouterMap:
    """The routers of one model in layer order, with the sizes routes of it must have."""

    slots: tuple[RouterSlot, ...]
    num_hidden_layers: int
    num_experts: int
    top_k: int
    routing_weights: RoutingWeights

    @property
    def num_layers(self) -> int:
        """MoE layers: the size of the routes' layer dimension."""
        return len(self.slots)

    @property
    def learned_positions(self) -> frozenset[int]:
        """Positions of the routers replay forces (all but the static ones)."""
        return frozenset(s.position for s in self.slots if not s.static)

    @property
    def decoder_layers(self) -> list[int]:
        """The decoder-layer index of every slot, in slot order."""
        return [s.decoder_layer for s in self.slots]


def router_map(model: torch.nn.Module, family: Any) -> RouterMap:
    """The `RouterMap` of ``model`` from its family's router adapters; `ConfigError` when the
    family cannot take part in routing replay."""
    name = family.model_type
    if family.router_modules is None:
        raise ConfigError(f"features.router_replay needs a MoE model; the {name!r} family has no "
                          f"routers (ModelFamily.router_modules); set "
                          f"features.router_replay.mode=disabled")
    if family.routing_weights is None:
        raise ConfigError(f"the {name!r} family has routers but no routing_weights, so routing "
                          f"replay cannot recompute the weights of replayed experts; the family "
                          f"(its model plugin) must provide ModelFamily.routing_weights")
    routers = list(family.router_modules(model))
    if not routers:
        raise ConfigError(f"the {name!r} model has no MoE layer; routing replay has nothing to "
                          f"replay: set features.router_replay.mode=disabled")
    blocks = list(family.decoder_blocks(model))
    static = family.static_routing or (lambda router: False)
    slots = tuple(RouterSlot(i, _decoder_layer(router, blocks), router, bool(static(router)))
                  for i, router in enumerate(routers))
    num_experts = _size(model.config, routers, "num_experts", _EXPERT_FIELDS)
    if num_experts > MAX_EXPERTS:
        raise ConfigError(f"the model has {num_experts} experts; routing replay stores expert "
                          f"ids as int16, which holds at most {MAX_EXPERTS}")
    return RouterMap(slots, len(blocks), num_experts,
                     _size(model.config, routers, "top_k", _TOP_K_FIELDS), family.routing_weights)


def _decoder_layer(router: torch.nn.Module, blocks: Sequence[torch.nn.Module]) -> int:
    for index, block in enumerate(blocks):
        if any(module is router for module in block.modules()):
            return index
    raise ConfigError(f"a router ({type(router).__name__}) of family.router_modules lies in no "
                      f"decoder block of family.decoder_blocks; the family's adapters disagree")


def _size(config: Any, routers: Sequence[torch.nn.Module], attribute: str,
          fields: Sequence[str]) -> int:
    """A size every router agrees on: the router attribute, else the model config field."""
    values = {getattr(r, attribute) for r in routers if hasattr(r, attribute)}
    if not values:
        values = {getattr(config, f) for f in fields if getattr(config, f, None)}
    if len(values) != 1:
        raise ConfigError(f"routing replay needs one {attribute} for all routers (a router "
                          f"attribute {attribute!r} or a config field {', '.join(fields)}); "
                          f"found {sorted(values) or 'none'}")
    return int(values.pop())
