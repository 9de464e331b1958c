"""R3 with an engine that generates with a torch model (the embedded engine): router hooks for
the duration of one rollout, and the per-sample routes they saw.

A rollout is one or more generations (the embedded engine generates prompts of one length
together for families where left padding is not exact). Each generation calls the model once on
its left-padded prompts (prefill: an empty KV cache), then once per new token. A forward
pre-hook on the model starts a generation at each prefill (noting each row's prompt) and notes
every call's ``(rows, steps)``; router hooks keep each call's ids ``(rows * steps, k)``. Laid end
to end, a row's calls cover its left pad, its prompt, then every fed response token: the last
response token is never fed, so like vLLM's output each sample has a route for all tokens but
its last. Samples are matched to generation rows by prompt, in order (rows a generation adds
to keep ranks in step match no sample and are dropped).
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from graft_router_replay.layers import RouterMap
from graft_router_replay.routes import RouteError, to_routes

# The keyword ``generate`` passes the KV cache to the model's forward under: ``cache`` from
# transformers 5.24 on (``past_key_values`` is deprecated there, removed in 5.40), before that
# ``past_key_values``.
CACHE_ARGUMENTS = ("cache", "past_key_values")


@dataclass
class Generation:
    """One ``generate`` call: its rows' prompts, left-padded to ``width``, and what it routed."""

    prompts: list[tuple[int, ...]]
    width: int
    calls: list[tuple[int, int]] = field(default_factory=list)
    ids: dict[int, list[torch.Tensor]] = field(default_factory=lambda: defaultdict(list))

    def token_grid(self, routers: RouterMap) -> torch.Tensor:
        """Every call's ids laid out ``(rows, steps_total, layers, k)`` on the CPU, int16."""
        per_layer = []
        for slot in routers.slots:
            calls = self.ids[slot.position]
            if len(calls) != len(self.calls):
                raise RouteError(f"the router at MoE position {slot.position} routed "
                                 f"{len(calls)} times during a generation of {len(self.calls)} "
                                 f"model calls")
            pieces = []
            for (rows, steps), ids in zip(self.calls, calls, strict=True):
                if ids.shape[0] != rows * steps:
                    raise RouteError(f"a generation call of {rows}x{steps} tokens routed "
                                     f"{ids.shape[0]} rows")
                pieces.append(ids.reshape(rows, steps, -1))
            per_layer.append(torch.cat(pieces, dim=1))
        return to_routes(torch.stack(per_layer, dim=2), routers.num_experts).cpu()


class GenerationRecorder:
    """Records every router's choices while ``model`` generates; `close` takes the hooks off."""

    def __init__(self, model: torch.nn.Module, routers: RouterMap) -> None:
        self.routers = routers
        self.generations: list[Generation] = []
        self.handles = [model.register_forward_pre_hook(self._note_call, with_kwargs=True)]
        for slot in routers.slots:
            self.handles.append(slot.router.register_forward_hook(self._keeper(slot.position)))

    def routes_for(self, samples: Sequence[Any]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per sample: int16 routes ``(P + R, layers, k)`` and the valid flag ``(P + R,)``
        (False on the last token)."""
        waiting: dict[tuple[int, ...], deque[int]] = defaultdict(deque)
        for index, sample in enumerate(samples):
            waiting[tuple(sample.prompt_ids)].append(index)
        found: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(samples)
        for generation in self.generations:
            grid = generation.token_grid(self.routers)
            for row, prompt in enumerate(generation.prompts):
                if waiting.get(prompt):
                    index = waiting[prompt].popleft()
                    found[index] = _sample_routes(grid[row], generation.width, samples[index])
        if any(f is None for f in found):
            raise RouteError(f"{found.count(None)} of {len(samples)} samples were not generated "
                             f"by the hooked model (its routers did not route them); the engine "
                             f"must generate with rollout.model (rollout.decode=dynamic)")
        return found

    def close(self) -> None:
        """Remove every hook this recorder installed."""
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def _note_call(self, module: torch.nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        cache = next((kwargs[name] for name in CACHE_ARGUMENTS if kwargs.get(name) is not None),
                     None)
        if ids is None or cache is None:
            raise RouteError("routing replay (R3) records generation from input_ids with a KV "
                             "cache; the engine called the model without them")
        if cache.get_seq_length() == 0:  # a prefill: a new generation starts
            mask = kwargs.get("attention_mask")
            kept = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()
            prompts = [tuple(row[keep].tolist()) for row, keep in zip(ids.cpu(), kept.cpu(),
                                                                        strict=True)]
            self.generations.append(Generation(prompts, int(ids.shape[1])))
        if not self.generations:
            raise RouteError("the first model call of a rollout continued a KV cache; routing "
                             "replay (R3) needs to see each generation's prefill")
        self.generations[-1].calls.append((int(ids.shape[0]), int(ids.shape[1])))

    def _keeper(self, position: int) -> Any:
        def keep(module: torch.nn.Module, args: Any, output: Any) -> None:
            if self.generations:
                self.generations[-1].ids[position].append(output[2].detach())

        return keep


def _sample_routes(row: torch.Tensor, width: int,
                   sample: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """One generation row ``(steps_total, layers, k)`` cut to ``sample``'s tokens."""
    start = width - len(sample.prompt_ids)
    total = len(sample.prompt_ids) + len(sample.response_ids)
    routes = torch.zeros((total, *row.shape[1:]), dtype=row.dtype)
    fed = min(total - 1, row.shape[0] - start)
    routes[:fed] = row[start:start + fed]
    valid = torch.zeros(total, dtype=torch.bool)
    valid[:fed] = True
    return routes, valid
