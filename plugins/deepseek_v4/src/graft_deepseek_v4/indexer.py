"""A tie-stable top-k for DeepSeek-V4's lightning indexer, so a sample's log-probs do not depend
on the length of its row.

The indexer scores each query against every compressed entry (``sum_h w_h ReLU(q_h . k)``) and
keeps the ``index_topk`` best with ``torch.topk``. When ReLU zeroes every head for several
entries, their scores tie at exactly 0, and which of them ``torch.topk`` keeps depends on the
length of the score row. A row padded after a shorter sample (one sample per row, or
``pad_to_length``) has more compressed entries (masked to -inf for the sample's queries), so the
sample attends to different entries than it does alone: ~1e-3 on its last log-probs.

Fix: after the indexer runs, recompute its choice from the same scores with a stable descending
sort (ties go to the lower entry index), applying transformers' own causal rule (entries at or
past ``(position + 1) // compress_rate`` are invalid, -1). Without ties the kept set is the same
as transformers'; with ties it no longer depends on what follows the sample. Installed with
forward hooks (no copy of transformers' code); the indexer has no gradient, so nothing else
changes.
"""

from __future__ import annotations

from typing import Any

import torch

_INSTALLED = "_graft_stable_topk"


def is_lightning_indexer(module: torch.nn.Module) -> bool:
    """True for transformers' ``DeepseekV4Indexer`` (by its parts, not its class)."""
    return all(hasattr(module, name) for name in ("scorer", "index_topk", "compress_rate"))


def install_stable_indexer_topk(model: torch.nn.Module) -> int:
    """Make every lightning indexer of ``model`` choose ties by entry index; idempotent.

    Returns the number of indexers changed by this call (0 when already installed).
    """
    count = 0
    for module in model.modules():
        if not is_lightning_indexer(module) or getattr(module, _INSTALLED, False):
            continue
        module.scorer.register_forward_hook(_keep_scores)
        module.register_forward_hook(_stable_choice, with_kwargs=True)
        setattr(module, _INSTALLED, True)
        count += 1
    return count


def _keep_scores(scorer: torch.nn.Module, args: Any, scores: torch.Tensor) -> None:
    scorer._graft_scores = scores.detach()


def _stable_choice(indexer: torch.nn.Module, args: tuple, kwargs: dict,
                   chosen: torch.Tensor) -> torch.Tensor:
    scores = indexer.scorer.__dict__.pop("_graft_scores", None)
    if scores is None or scores.shape[-1] == 0:
        return chosen
    position_ids = kwargs["position_ids"] if "position_ids" in kwargs else args[2]
    return stable_top_k(scores, position_ids, top_k=min(indexer.index_topk, scores.shape[-1]),
                        compress_rate=indexer.compress_rate)


def stable_top_k(scores: torch.Tensor, position_ids: torch.Tensor, *, top_k: int,
                 compress_rate: int) -> torch.Tensor:
    """The indexer's choice ``(B, S, top_k)`` from its scores ``(B, S, T)``: the ``top_k``
    highest causal entries, ties to the lower index; slots past the causal limit are -1."""
    threshold = ((position_ids + 1) // compress_rate).unsqueeze(-1)  # (B, S, 1)
    entries = torch.arange(scores.shape[-1], device=scores.device)
    masked = scores.masked_fill(entries >= threshold, float("-inf"))
    order = masked.sort(dim=-1, descending=True, stable=True).indices[..., :top_k]
    return torch.where(order >= threshold, torch.full_like(order, -1), order)
