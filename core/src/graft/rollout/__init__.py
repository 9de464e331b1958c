"""Rollout engines for RL: the trainer's own model (embedded) or a plugin's (graft-vllm's
``vllm``), behind one interface (`graft.rollout.types.RolloutEngine`). Public: `RolloutEngine`,
`RolloutSample`, `SamplingSpec`, `refuse_extras` (an engine's answer to extras it cannot
return) and `cut_at_eos` (a generated row up to its first ``eos``); for a plugin that makes a
step's samples in place of one ``generate`` (``graft_episode_runner``: graft-multiturn's
episodes) `EpisodeRunner` and `EpisodeBatch`; for a plugin's attention
implementation, `register_boolean_mask_attention` (a plugin's decode loop, supplied through
``graft_static_decoder``, may hand it a boolean mask), which such a loop reads with
`boolean_mask_attentions`; for a plugin whose adapters an inference engine loads itself
(``graft_rollout_adapter``: graft-lora's, loaded by graft-vllm), `RolloutAdapter`; for a
plugin's decode loop that honours ``SamplingSpec.seeds`` (``rollout.seeded_sampling``),
`seeded_scores` and `token_keys` (the core's seeded draw).

Importing the package is cheap (the built-in engine registry lives here and loads with every
command); the types import torch when first used.
"""

from typing import Any

__all__ = ["EpisodeBatch", "EpisodeRunner", "RolloutAdapter", "RolloutEngine", "RolloutSample",
           "SamplingSpec", "cut_at_eos", "refuse_extras", "boolean_mask_attentions",
           "register_boolean_mask_attention", "seeded_scores", "token_keys"]
# transformers attention implementations (their ``AttentionInterface`` names) that plugins said
# take a decode loop's boolean mask (`register_boolean_mask_attention`)
_BOOLEAN_MASK_ATTENTIONS: set[str] = set()


def register_boolean_mask_attention(name: str) -> None:
    """Let a plugin's decode loop (``graft_static_decoder``: graft-graphed-decode's, from CUDA
    graphs) decode a model whose attention is ``name`` (registered with transformers'
    ``AttentionInterface``), handing it a boolean ``(batch, 1, queries, keys)`` mask (True:
    attend) that may cover fewer keys than the cache holds (the slots filled so far).
    Idempotent; call it when registering the attention."""
    _BOOLEAN_MASK_ATTENTIONS.add(name)


def boolean_mask_attentions() -> frozenset[str]:
    """The attention implementations registered with `register_boolean_mask_attention` so far
    (a decode loop asks when it is built, after the plugins installed their attentions)."""
    return frozenset(_BOOLEAN_MASK_ATTENTIONS)


def __getattr__(name: str) -> Any:
    if name in ("seeded_scores", "token_keys"):
        from graft.rollout import seeded

        return getattr(seeded, name)
    if name in __all__:
        from graft.rollout import types

        return getattr(types, name)
    raise AttributeError(f"module 'graft.rollout' has no attribute {name!r}")
