"""How routes are stored and which rows replay them.

A route is the list of experts one token used in one MoE layer. Routes are stored as int16
expert ids ``[tokens, moe_layers, top_k]`` (per sample) or ``[rows, row_length, moe_layers,
top_k]`` (in a packed micro-batch), with a per-token valid flag beside them. int16 holds up to
32767 experts at a quarter of int64's bytes. Routes never cross ranks: each rank records and
replays the tokens its own routers route (with expert parallelism too: the router runs before
the dispatch, on the rank's own tokens).

Row rule: a row replays its ids unless the token has no route (valid flag off: pad tokens, the
last token of a rollout sample, which no engine routes) or the row repeats an expert id (a
malformed or zero-filled route; repeated ids would also break expert-parallel dispatch). Such a
row routes natively. The explicit flag is what protects top-1 models, where a zero row repeats
nothing.
"""

from __future__ import annotations

from typing import Any

import torch

from graft.errors import DataError

ROUTES = "routed_experts"  # the batch / sample-extras key of the int16 ids
VALID = "routed_experts_valid"  # the key of the bool per-token flag: True where a route exists
ROUTE_DTYPE = torch.int16
MAX_EXPERTS = torch.iinfo(ROUTE_DTYPE).max  # 32767: the largest expert count int16 ids cover


class RouteError(DataError):
    """Routes that do not fit the model: wrong shape, layer count or expert id range, or a
    replay that did not reach every recorded layer."""


def to_routes(ids: torch.Tensor, num_experts: int) -> torch.Tensor:
    """``ids`` (any integer dtype) as int16 routes, after checking ``0 <= id < num_experts``."""
    if ids.numel():
        low, high = int(ids.min()), int(ids.max())
        if low < 0 or high >= num_experts:
            raise RouteError(f"expert ids range over [{low}, {high}], outside the model's "
                             f"{num_experts} experts [0, {num_experts - 1}]")
    return ids.to(ROUTE_DTYPE)


def duplicate_rows(routes: torch.Tensor) -> torch.Tensor:
    """True for each row (last dim = the top-k ids) that names an expert more than once."""
    ordered = routes.sort(dim=-1).values
    return (ordered[..., 1:] == ordered[..., :-1]).any(dim=-1)


def native_rows(routes: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``[tokens, layers]``: True where the row routes natively (no route, or repeated ids)."""
    return ~valid.bool()[:, None] | duplicate_rows(routes)


def real_tokens(layout: Any) -> torch.Tensor:
    """``(R, L)`` bool grid of a micro-batch's layout: True on sample tokens, False on pad."""
    return layout.pack([torch.ones(s.length, dtype=torch.bool) for s in layout.segments],
                       fill=False)


def bytes_per_token(routes: torch.Tensor, valid: torch.Tensor) -> int:
    """Bytes one token's routes and flag take in storage (all MoE layers)."""
    layers, top_k = routes.shape[-2:]
    return layers * top_k * routes.element_size() + valid.element_size()
