"""One function that turns whatever a rollout engine returns as routed experts into routes.

Accepted: an array or tensor ``[tokens, layers, top_k]`` of any integer dtype (vLLM:
``CompletionOutput.routed_experts``, uint8 up to 256 experts, uint16 beyond), nested lists, a
base64 string of int32 values (SGLang's ``routed_experts``), or a pair ``(prompt, completion)``
of arrays (engines that split the prompt's routes from the generated ones). ``layers`` is either
the model's MoE layer count or its decoder layer count (vLLM indexes by decoder layer; dense
layers' rows are dropped). ``tokens`` is ``P + R - 1`` (engines route every token but the last,
which is never fed back) or more (extra rows are dropped).
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import torch

from graft_router_replay.layers import RouterMap
from graft_router_replay.routes import RouteError, duplicate_rows, to_routes

ENGINE_OUTPUT = "routed_experts"  # the per-request output engines return routes under


def ingest_routes(raw: Any, *, prompt_length: int, response_length: int,
                  routers: RouterMap) -> tuple[torch.Tensor, torch.Tensor]:
    """Validated int16 routes ``(P + R, moe_layers, top_k)`` and the valid flag ``(P + R,)``
    (False for tokens the engine did not route) of one sample; `RouteError` naming what does
    not fit."""
    if raw is None:
        raise RouteError("the rollout engine returned no routed experts for a sample; it must "
                         "be asked for them (rollout.request_extras) before it starts")
    total = prompt_length + response_length
    ids = _by_layer(_as_array(raw, routers, total), routers)
    if ids.shape[0] < total - 1:
        raise RouteError(f"the engine routed {ids.shape[0]} tokens of a sample with "
                         f"{prompt_length} prompt and {response_length} response tokens; "
                         f"expected at least {total - 1} (all tokens but the last)")
    ids = ids[:total]
    routes = torch.zeros((total, *ids.shape[1:]), dtype=torch.int16)
    routes[:len(ids)] = to_routes(ids, routers.num_experts)
    valid = torch.zeros(total, dtype=torch.bool)
    valid[:len(ids)] = returned_rows(routes[:len(ids)])
    if len(ids) and not bool(valid.any()):
        raise RouteError("every route the engine returned is zero in every layer: the engine "
                         "filled no row (its capture is broken, or it ran without it)")
    if routers.top_k > 1 and len(ids) and bool(duplicate_rows(routes[:len(ids)]).all()):
        raise RouteError("every route the engine returned repeats an expert (all-zero routes?); "
                         "the engine's capture is broken (vLLM PR #49184 fixed one such kernel)")
    return routes, valid


def returned_rows(routes: torch.Tensor) -> torch.Tensor:
    """``(tokens,)``: True for the tokens the engine routed, False for rows it left zero.

    Engines capture routes into zero-initialised buffers and return rows they did not fill
    (tokens whose KV came from elsewhere: an external or offloaded KV cache, a prefill on
    another node) as zeros in every layer. With top-k > 1 such a row repeats expert 0 and
    routes natively anyway (`routes.native_rows`); with top-1 it would replay expert 0 in
    every layer, so a token whose ids are 0 in every MoE layer counts as not routed. A token the
    router really sent to expert 0 in every layer (chance ``num_experts ** -moe_layers`` for
    top-1) then routes natively, as a token without a route does.
    """
    return routes.reshape(routes.shape[0], -1).any(dim=-1)


def _as_array(raw: Any, routers: RouterMap, total: int) -> torch.Tensor:
    """``raw`` as an int64 tensor ``[tokens, layers, top_k]`` (``total``: the sample's tokens)."""
    if isinstance(raw, tuple) and len(raw) == 2:  # (prompt, completion) arrays
        return torch.cat([_as_array(part, routers, total) for part in raw])
    if isinstance(raw, (str, bytes)):
        flat = np.frombuffer(base64.b64decode(raw), dtype=np.int32)
        return _unflatten(torch.from_numpy(flat.astype(np.int64)), routers, total)
    if isinstance(raw, torch.Tensor):
        array = raw.detach().cpu().to(torch.int64)
    else:
        array = torch.from_numpy(np.asarray(raw).astype(np.int64))
    if array.dim() == 3:
        return array
    if array.dim() == 2:
        return _unflatten(array.reshape(-1), routers, array.shape[0])
    raise RouteError(f"routed experts of shape {tuple(array.shape)}: expected "
                     f"[tokens, layers, {routers.top_k}]")


def _unflatten(flat: torch.Tensor, routers: RouterMap, total: int) -> torch.Tensor:
    """Flat ids as ``[tokens, layers, top_k]``: ``total - 1`` or ``total`` tokens of the MoE or
    the decoder layer count."""
    for tokens in (total - 1, total):
        for layers in (routers.num_layers, routers.num_hidden_layers):
            if tokens > 0 and flat.numel() == tokens * layers * routers.top_k:
                return flat.reshape(tokens, layers, routers.top_k)
    raise RouteError(f"{flat.numel()} routed expert ids are not {total - 1} or {total} tokens x "
                     f"{routers.num_layers} (or {routers.num_hidden_layers}) layers x "
                     f"top-{routers.top_k}")


def _by_layer(ids: torch.Tensor, routers: RouterMap) -> torch.Tensor:
    """``[tokens, layers, k]`` reduced to the MoE layers, in router order."""
    layers, top_k = ids.shape[1:]
    if top_k != routers.top_k:
        raise RouteError(f"routed experts give {top_k} experts per token; the model routes "
                         f"each token to {routers.top_k}")
    if layers == routers.num_layers:
        return ids
    if layers == routers.num_hidden_layers:
        return ids[:, routers.decoder_layers]
    raise RouteError(f"routed experts cover {layers} layers; the model has {routers.num_layers} "
                     f"MoE layers in {routers.num_hidden_layers} decoder layers")
