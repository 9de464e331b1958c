"""The ``features.exact`` config section: whether the batch-invariant kernels run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class ExactConfig:
    """``features.exact``: exact on-policy sampling."""

    # The trainer's forward and the embedded engine's prefill and decode steps compute every
    # token's logits with batch-invariant kernels (fixed-tile products, attention over each
    # query's own key window, pairwise-tree reductions), so the rollout's sampling log-probs
    # equal the trainer's bit for bit (train_infer_logprob_diff 0.0,
    # train_infer_logprob_exact_fraction 1.0). Needs rollout.engine=embedded and a model of
    # softmax attention, sliding windows included (a ConfigError names what cannot be served);
    # turns graft-graphed-decode's features.graphed_decode.fuse_kernels off. Costs: this
    # plugin's README.md.
    enabled: bool = False


def exact_enabled(cfg: Any) -> bool:
    """True when ``cfg`` (the root config; None outside a run) asks for the exact kernels;
    False for a config composed without this plugin's section."""
    section = getattr(getattr(cfg, "features", None), "exact", None)
    return bool(section is not None and section.enabled)
