"""One compiled graph for every decoder block of the graphed decode loop (regional compilation).

Compiling the decode step whole traces, lowers and schedules every layer again, so a first
rollout spent minutes compiling (bench/README.md). The layers are the same code
with other weights, so here each block's ``forward`` goes through one compiled function per
block class, and all blocks reuse its graph (their parameters are graph inputs).

Two things would make each block compile again. transformers' attention writes its keys and
values with ``cache.update(k, v, self.layer_idx)``, a different constant per block; each block
gets the cache narrowed to its own layer instead (`_OneLayerCache`), which ignores the index.
And the prefill (many query positions) would be a second graph and round differently from the
eager forward it has always run; it stays eager: a block runs compiled only for single-position
(decode) inputs, and only inside `compiled_blocks` (the decoder that asked for them: another
decoder over the same model, or the trainer's forward, runs the eager blocks).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch

from graft.models import CACHE_KEYWORDS

ROUTED = "_graft_regional_compile"  # marks a block whose forward is already routed
_ENABLED: ContextVar[bool] = ContextVar("graft_compiled_blocks", default=False)


@contextmanager
def compiled_blocks(enabled: bool = True) -> Iterator[None]:
    """Within this context the routed blocks (`compile_decoder_blocks`) run their compiled
    decode forward; outside it (or with ``enabled`` false) they run eagerly."""
    token = _ENABLED.set(enabled)
    try:
        yield
    finally:
        _ENABLED.reset(token)


class _OneLayerCache:
    """A block's view of a layered cache (transformers' ``Cache``): ``update`` writes the
    block's own layer, whatever layer index the attention passes."""

    def __init__(self, layer: Any) -> None:
        self.layer = layer

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's ``update``: the new keys and values written, the whole cache returned."""
        return self.layer.update(key_states, value_states, *args, **kwargs)


def compile_decoder_blocks(blocks: Sequence[torch.nn.Module], *,
                           options: dict[str, Any] | None = None) -> None:
    """Route each block's single-position forward, inside `compiled_blocks`, through one
    ``torch.compile`` of its class's ``forward`` (dynamic shapes: every batch size, cache and
    attended length), with the cache narrowed to the block's layer (blocks already routed are
    left as they are). ``options`` are inductor's (`torch.compile`).

    Blocks must hold the KV cache in a ``Cache`` whose ``layers[i]`` is block ``i``'s (the
    static cache of `graft_graphed_decode.decoder`).
    """
    compiled: dict[type, Callable[..., Any]] = {}
    for index, block in enumerate(blocks):
        if getattr(block, ROUTED, False):  # a second decoder over the same model
            continue
        cls = type(block)
        if cls not in compiled:
            compiled[cls] = torch.compile(cls.forward, fullgraph=True, dynamic=True,
                                          options=options)
        block.forward = _routed_forward(block, index, compiled[cls])
        setattr(block, ROUTED, True)


def _routed_forward(block: torch.nn.Module, index: int,
                    compiled: Callable[..., Any]) -> Callable[..., Any]:
    eager = block.forward

    def forward(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        keyword = next((k for k in CACHE_KEYWORDS if kwargs.get(k) is not None), None)
        # The prefill (eager, as it always was), and a cache's first write, which allocates it.
        if (not _ENABLED.get() or hidden_states.shape[1] != 1 or keyword is None
                or not kwargs[keyword].layers[index].is_initialized):
            return eager(hidden_states, *args, **kwargs)
        kwargs[keyword] = _OneLayerCache(kwargs[keyword].layers[index])
        # Without duck shapes a batch that happens to equal another size (8 rows, 8 key/value
        # heads) is not tied to it, so the first graph serves every batch size.
        with torch.fx.experimental._config.patch(use_duck_shape=False):
            return compiled(block, hidden_states, *args, **kwargs)

    return forward
